"""Checkpoint stall of a 2-process job: our sharded writer (FSDP) vs our DDP writer vs DCP's ``async_save``.

    python -m entrypoint run --framework pytorch --script bench/sharded_ckpt.py --nproc-per-node 2 -- \
        --config 100m --repeats 3 --warmup 1 --dir /tmp/ckpts --result /tmp/result.json

Every rank builds the ``bench.gpt`` GPT twice: sharded as the entrypoint shards it (``parallel.Sharded``: FSDP2
per block, then the root) and replicated under DDP, each with AdamW after one step (so Adam's moments exist).
Then, in rotating order after warm-up rounds, each kind of save is timed as the hooks loop would meet it:

- ``ours sharded sync|async (FSDP)``: the entrypoint's ``ShardedCheckpointIO`` (its staging buffers kept between
  saves, the write on a gloo group of its own), given what ``LoopCheckpoints.save`` gives it
  (``restore.sharded_state``: each rank's shards);
- ``ours async (DDP)``: the entrypoint's ``ReplicatedCheckpointIO`` (async) on the chief, given the replicated payload;
- ``DCP async_save (FSDP)``: plain ``torch.distributed.checkpoint.async_save`` of ``get_state_dict`` over its
  own gloo group (what its documentation recommends; its default stager, a fresh host copy each call).

Blocked: from the state dict's creation until the call returns; written: until the save is complete (committed,
for ours). Both are the slower rank's (the next collective waits for it). Nothing trains while a save is written
(as in the single-process rows). Rank 0 writes every run's ``(blocked, written)`` seconds as JSON to ``--result``.

``--device cuda`` (a GPU machine, one GPU per process, one process too): the models and Adam state live on the
GPUs, the collectives go over nccl (the checkpoints' over gloo, as in training), and our sharded writer stages
into pinned host buffers, as the hooks loop runs it on a GPU. With ``--verify`` every rank then reads the newest
committed ``ours sharded async`` checkpoint into a freshly built sharded model and optimizer and compares every
shard with what was saved (``verified`` in the result: a staging copy read before it completed would differ).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the checkout, not bench/: finds bench and entrypoint
from bench.common import interleave  # noqa: E402
from bench.gpt import CONFIGS, GPT, GPTConfig, configure_optimizer, corpus, window  # noqa: E402
from entrypoint.outputs import checkpoints  # noqa: E402
from entrypoint.pytorch.checkpoints import restore  # noqa: E402
from entrypoint.pytorch.checkpoints.checkpoint_io import ReplicatedCheckpointIO  # noqa: E402
from entrypoint.pytorch.checkpoints.sharded_io import ShardedCheckpointIO  # noqa: E402
from entrypoint.pytorch.loop import parallel  # noqa: E402


def parse_args() -> argparse.Namespace:
    """Model size, repetitions, where to write."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--dir", required=True, help="where the checkpoints go (a directory on this machine)")
    parser.add_argument("--result", required=True, help="JSON file rank 0 writes the seconds to")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the models live")
    parser.add_argument("--verify", action="store_true",
                        help="read the newest 'ours sharded async' checkpoint back and compare it with what was saved")
    return parser.parse_args()


def one_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, block_size: int, vocab: int,
             device: torch.device) -> None:
    """A training step on one window (Adam's moments exist afterwards)."""
    x, y = window(corpus(vocab, 4 * block_size), dist.get_rank(), block_size)
    model(x[None].to(device), y[None].to(device)).backward()
    optimizer.step()
    optimizer.zero_grad()


class Saves:
    """Each kind of save, timed on every rank; the slower rank's (blocked, written) seconds, kept by kind."""

    def __init__(self, root: Path, sharded: torch.nn.Module, sharded_opt: torch.optim.Optimizer,
                 ddp: DDP, ddp_opt: torch.optim.Optimizer, cuda: bool) -> None:
        self.root, self.rank = root, dist.get_rank()
        self.sharded, self.sharded_opt, self.ddp, self.ddp_opt = sharded, sharded_opt, ddp, ddp_opt
        timeout = 600.0
        self.ours = {mode: ShardedCheckpointIO(1, self.rank, mode, timeout, cuda) for mode in ("sync", "async")}
        self.replicated = ReplicatedCheckpointIO(1, "async")
        self.dcp_group = dist.new_group(backend="gloo")
        self.count = 0
        self.seconds: dict[str, list[tuple[float, float]]] = {}

    def _path(self, kind: str) -> Any:
        self.count += 1
        return checkpoints.checkpoint_path(self.root / kind.replace(" ", "-"), self.count)

    def _meta(self) -> dict[str, Any]:
        return {"step": self.count, "epoch": 0, "batch": self.count, "sample": self.count, "framework": "pytorch",
                "world_size": dist.get_world_size()}

    def _keep(self, name: str, blocked: float, written: float) -> float:
        slowest = torch.tensor([blocked, written], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        pair = (float(slowest[0]), float(slowest[1]))
        self.seconds.setdefault(name, []).append(pair)
        return pair[0]

    def ours_sharded(self, mode: str) -> float:
        """The entrypoint's sharded writer, as ``LoopCheckpoints.save`` calls it."""
        io, path = self.ours[mode], self._path(f"sharded {mode}")
        dist.barrier()
        before = io.write_seconds
        started = time.perf_counter()
        state = {"shards": restore.sharded_state(self.sharded, self.sharded_opt), "extra": {"step": self.count}}
        io.save(path, state, {**self._meta(), "sharded": True})
        blocked = time.perf_counter() - started
        io.wait()
        return self._keep(f"ours sharded {mode} (FSDP)", blocked, io.write_seconds - before)

    def ours_replicated(self) -> float:
        """The entrypoint's DDP writer: the chief copies the whole state, a thread writes it."""
        io, path = self.replicated, self._path("replicated async")
        dist.barrier()
        blocked = written = 0.0
        if self.rank == 0:
            before = io.write_seconds
            started = time.perf_counter()
            module: torch.nn.Module = self.ddp.module
            payload = {"model": module.state_dict(), "optimizer": self.ddp_opt.state_dict(),
                       "optimizer_fqns": restore.optimizer_fqns(module, self.ddp_opt), "step": self.count}
            io.save(path, payload, {**self._meta(), "sharded": False})
            blocked = time.perf_counter() - started
            io.wait()
            written = io.write_seconds - before
        return self._keep("ours async (DDP)", blocked, written)

    def dcp_async(self) -> float:
        """``torch.distributed.checkpoint.async_save`` of the sharded model over its own gloo group."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        path = self._path("dcp async_save")
        dist.barrier()
        started = time.perf_counter()
        model_state, optim_state = get_state_dict(self.sharded, self.sharded_opt)
        future: Any = dcp.async_save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path),
                                     process_group=self.dcp_group)
        blocked = time.perf_counter() - started
        future.result()
        written = time.perf_counter() - started - blocked
        dist.barrier()
        if self.rank == 0:
            shutil.rmtree(path, ignore_errors=True)  # ours keep one each (their retention); DCP keeps everything
        return self._keep("DCP async_save (FSDP)", blocked, written)

    def close(self) -> None:
        """Wait for everything, release the staging buffers."""
        for io in self.ours.values():
            io.close()
        self.replicated.wait()


def sharded_model(cfg: GPTConfig, device: torch.device, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The GPT sharded as the entrypoint shards it, with AdamW after one step."""
    torch.manual_seed(seed)
    model = parallel.Sharded(parallel.Choice("fsdp", "bench"), device, 1, dist.get_world_size(), False, False) \
        .shard(GPT(cfg), None)
    optimizer = configure_optimizer(model)
    one_step(model, optimizer, cfg.block_size, cfg.vocab_size, device)
    return model, optimizer


def verify(cfg: GPTConfig, device: torch.device, saved: torch.nn.Module, saved_opt: torch.optim.Optimizer,
           io: ShardedCheckpointIO, checkpoint_dir: Path) -> bool:
    """Whether the newest committed checkpoint in ``checkpoint_dir``, read into a model built from another seed,
    holds exactly the shards of ``saved`` and ``saved_opt`` (nothing trained since the save), on every rank."""
    _, path = checkpoints.committed(checkpoint_dir)[-1]
    model, optimizer = sharded_model(cfg, device, seed=1)
    shards = restore.sharded_state(model, optimizer)
    io.load(path, {"shards": shards, "extra": None})
    restore.apply_sharded(model, optimizer, shards)

    def local(tensor: Any) -> Any:
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    same = all(torch.equal(local(a), local(b)) for a, b in zip(model.parameters(), saved.parameters(), strict=True))
    for a, b in zip(optimizer.state.values(), saved_opt.state.values(), strict=True):
        same = same and all(torch.equal(local(a[k]), local(b[k])) for k in ("exp_avg", "exp_avg_sq"))
    everyone = torch.tensor([0.0 if same else 1.0], dtype=torch.float64)
    dist.all_reduce(everyone, op=dist.ReduceOp.MAX)  # a CPU tensor: over gloo
    return bool(everyone.item() == 0.0)


def main() -> None:
    """Build both models, time every kind of save in rotation, report from rank 0."""
    args = parse_args()
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("cuda:nccl,cpu:gloo" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    cfg = CONFIGS[args.config]
    sharded, sharded_opt = sharded_model(cfg, device, seed=0)
    torch.manual_seed(0)
    replica = GPT(cfg).to(device)
    params = sum(p.numel() for p in replica.parameters())
    ddp = DDP(replica, device_ids=[device.index] if cuda else None)
    ddp_opt = configure_optimizer(ddp)
    one_step(ddp, ddp_opt, cfg.block_size, cfg.vocab_size, device)
    saves = Saves(Path(args.dir), sharded, sharded_opt, ddp, ddp_opt, cuda)
    interleave({"ours sharded sync (FSDP)": lambda: saves.ours_sharded("sync"),
                "ours sharded async (FSDP)": lambda: saves.ours_sharded("async"),
                "ours async (DDP)": saves.ours_replicated,
                "DCP async_save (FSDP)": saves.dcp_async}, args.repeats, args.warmup)
    saves.close()
    verified = verify(cfg, device, sharded, sharded_opt, saves.ours["async"], Path(args.dir) / "sharded-async") \
        if args.verify else None
    if rank == 0:
        Path(args.result).write_text(json.dumps({
            "params": params, "world_size": world, "config": args.config, "warmup": args.warmup,
            "seconds": saves.seconds, "device": str(device), "verified": verified,
            "device_name": torch.cuda.get_device_name() if cuda else "cpu"}))
    dist.barrier()


if __name__ == "__main__":
    main()
