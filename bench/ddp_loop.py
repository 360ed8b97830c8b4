"""A plain hand-written DDP training loop in the nanoGPT style: the anchor the entrypoint's loop is measured against.

    torchrun --standalone --nproc-per-node 2 bench/ddp_loop.py --config cpu --steps 200   # DDP
    python bench/ddp_loop.py --config tiny --steps 50                                     # no DDP (bare model)
    torchrun --standalone --nproc-per-node 1 bench/ddp_loop.py --shard --bf16 --compile   # the entrypoint's FSDP2

With ``--shard`` the model is sharded by the entrypoint's own ``parallel.Sharded`` (FSDP2 per block, then the root;
bf16 parameters with fp32 reductions under ``--bf16``, each block compiled under ``--compile``), over every process
torchrun started, one GPU too: the sharded path the entrypoint takes from two processes on, timed without its loop.

Same model, data and optimizer as ``bench.gpt_hooks`` (all from ``bench.gpt``). Throughput is timed
between the start of step ``--warmup`` and the start of the last step, exactly where the hooks module
times the entrypoint's loop, and written by rank 0 as JSON to ``--result``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the checkout, not bench/: finds bench.gpt
from bench.gpt import CONFIGS, GPT, configure_optimizer, corpus  # noqa: E402


def parse_args() -> argparse.Namespace:
    """Size of the model and of the run."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8, help="per process")
    parser.add_argument("--corpus-tokens", type=int, default=1 << 20)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (GPU)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU)")
    parser.add_argument("--shard", action="store_true",
                        help="shard with the entrypoint's parallel.Sharded (FSDP2) instead of DDP (needs torchrun)")
    parser.add_argument("--clip-grad-norm", type=float, default=1.0)
    parser.add_argument("--result", help="JSON file rank 0 writes its throughput to")
    return parser.parse_args()


def main() -> None:
    """Set up (DDP when RANK is set), train ``--steps`` steps, report tokens/s."""
    args = parse_args()
    ddp = int(os.environ.get("RANK", -1)) != -1
    if ddp:
        local_rank = int(os.environ["LOCAL_RANK"])
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    else:
        rank, world = 0, 1
        device = "cuda:0" if torch.cuda.is_available() else "cpu"  # torch 2.11's set_device refuses a bare "cuda"
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    torch.manual_seed(42)
    cfg = CONFIGS[args.config]
    data = corpus(cfg.vocab_size, args.corpus_tokens)
    g = torch.Generator().manual_seed(1000 + rank)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(data) - cfg.block_size - 1, (args.batch_size,), generator=g)
        x = torch.stack([data[i:i + cfg.block_size] for i in ix.tolist()])
        y = torch.stack([data[i + 1:i + 1 + cfg.block_size] for i in ix.tolist()])
        if device.startswith("cuda"):
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y

    raw: Any
    if args.shard:
        if not ddp:
            raise SystemExit("--shard needs torchrun's process group (RANK, WORLD_SIZE, ...)")
        from entrypoint.pytorch.loop import parallel

        sharding = parallel.Sharded(parallel.Choice("fsdp", "bench"), torch.device(device), 1, world, args.bf16,
                                    args.compile)
        raw = sharding.shard(GPT(cfg), None)
        model: Any = raw
    else:
        raw = GPT(cfg).to(device)
        model = torch.compile(raw) if args.compile else raw
        if ddp:
            model = DDP(model, device_ids=[local_rank] if device.startswith("cuda") else None)
    optimizer = configure_optimizer(raw)
    bf16 = args.bf16 and device.startswith("cuda")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else nullcontext()

    t0 = t1 = first_step_seconds = 0.0
    loss = torch.zeros(())
    started = time.perf_counter()  # the first step's seconds: compiling (with --compile) and the first batches
    for step in range(args.steps):
        x, y = get_batch()
        if step in (args.warmup, args.steps - 1):  # the timed window: forward start to forward start
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0, t1 = (time.perf_counter(), t1) if step == args.warmup else (t0, time.perf_counter())
        with autocast:
            loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
        optimizer.step()
        if step == 0:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            first_step_seconds = time.perf_counter() - started

    timed_steps = args.steps - 1 - args.warmup
    tokens_per_second = timed_steps * args.batch_size * cfg.block_size * world / max(t1 - t0, 1e-9)
    if rank == 0 and args.result:
        Path(args.result).write_text(json.dumps({
            "tokens_per_second": tokens_per_second, "timed_steps": timed_steps, "seconds": t1 - t0,
            "world_size": world, "loss": float(loss.detach()), "params": raw.num_params(),
            "flops_per_token": raw.flops_per_token(), "device": device,
            "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
            "first_step_seconds": first_step_seconds, "sharded": args.shard, "compiled": args.compile,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None,
        }))
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    if int(os.environ.get("RANK", -1)) != -1 and not os.environ.get("TRAINER_PLAN_FILE"):  # see ddp_script.leave
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
