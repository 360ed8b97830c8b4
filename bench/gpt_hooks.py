"""The GPT of ``bench.gpt`` as an entrypoint hooks module: the entrypoint owns the loop, this file says what to train.

    python -m entrypoint run --framework pytorch --module bench.gpt_hooks --batch-size 8 \
        -- --config tiny --steps 50 --batch 8

Same model, data and optimizer as the hand-written ``bench/ddp_loop.py``. ``compute_loss`` times the
loop between the start of step ``--warmup`` and the start of the last step (where the hand loop times
itself); the ``export`` hook writes that throughput to ``<model_dir>/bench_timing.json``.

For the memory benchmark (``bench.memory``, any ``--strategy``): with ``BENCH_PID_DIR`` set, every training
process writes ``$BENCH_PID_DIR/<pid>`` (JSON: its rank and its peak resident set, ``VmHWM``, when training
ends: at its first evaluation batch, before the epoch's checkpoint and the export). With ``--export`` the
``export`` hook also runs the entrypoint's own export (``model.safetensors``, streamed tensor by tensor) and
records how far it raised this process's peak resident set (``/proc/self/clear_refs`` resets ``VmHWM``) next
to the largest tensor.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from bench.gpt import CONFIGS, GPT, configure_optimizer, corpus, window

DEFAULTS = {"epochs": 1, "batch_size": 8}
_timer: dict[str, Any] = {"step": 0, "t0": 0.0, "t1": 0.0}
_memory: dict[str, Any] = {"recorded": False, "export": False}
MIB = 1 << 20


def status_mib(field: str) -> float:
    """A ``/proc/self/status`` field in MiB (``VmHWM``: the peak resident set; ``VmRSS``: the current one)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def reset_peak() -> bool:
    """Reset this process's ``VmHWM`` to its current resident set (Linux: ``echo 5 > /proc/self/clear_refs``)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def record_training_peak(rank: int) -> None:
    """Once per process, where ``BENCH_PID_DIR`` asks: this rank's peak resident set so far (training's)."""
    where = os.environ.get("BENCH_PID_DIR")
    if where and not _memory["recorded"]:
        _memory["recorded"] = True
        (Path(where) / str(os.getpid())).write_text(json.dumps({"rank": rank, "train_peak_mib": status_mib("VmHWM"),
                                                                "rss_mib": status_mib("VmRSS")}))


class TokenWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``n`` random windows of the synthetic corpus (inputs, next-token targets)."""

    def __init__(self, data: torch.Tensor, block_size: int, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.data, self.block_size = data, block_size
        self.starts = torch.randint(len(data) - block_size - 1, (n,), generator=g).tolist()

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return window(self.data, self.starts[i], self.block_size)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Model size and run length (``--batch`` must equal the entrypoint's ``--batch-size``)."""
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=DEFAULTS["batch_size"])
    parser.add_argument("--corpus-tokens", type=int, default=1 << 20)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (GPU)")
    parser.add_argument("--step-sleep", type=float, default=0.0,
                        help="seconds each step sleeps (a tiny model's steps as long as a large one's)")
    parser.add_argument("--export", action="store_true",
                        help="also write model.safetensors through the entrypoint's export and measure its peak memory")


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[TokenWindows, TokenWindows]:
    """Exactly ``--steps`` steps of windows for every replica, and one batch per replica to evaluate."""
    cfg = CONFIGS[args.config]
    if os.environ.get("BENCH_PID_DIR"):  # a training process (bench.memory tells them from the launcher's)
        (Path(os.environ["BENCH_PID_DIR"]) / str(os.getpid())).touch()
    _memory["export"] = args.export
    data = corpus(cfg.vocab_size, args.corpus_tokens)
    _timer.update(steps=args.steps, warmup=args.warmup, tokens=args.batch * cfg.block_size * ctx.world_size,
                  sleep=args.step_sleep)
    train = TokenWindows(data, cfg.block_size, args.steps * args.batch * ctx.world_size, seed=0)
    return train, TokenWindows(data, cfg.block_size, args.batch * ctx.world_size, seed=1)


def build_model(args: argparse.Namespace, ctx: Any) -> nn.Module:
    """The GPT, compiled with ``--compile`` (the entrypoint wraps it in DDP afterwards, as nanoGPT does)."""
    model = GPT(CONFIGS[args.config])
    _timer.update(params=model.num_params(), flops_per_token=model.flops_per_token())
    return torch.compile(model.to(ctx.device)) if args.compile else model  # type: ignore[return-value]


def build_optimizer(model: nn.Module, args: argparse.Namespace, ctx: Any) -> torch.optim.Optimizer:
    """The same AdamW as the hand-written loop."""
    return configure_optimizer(model)


def compute_loss(model: nn.Module, batch: Any, ctx: Any) -> torch.Tensor:
    """The model's loss; marks the start of the timed window and of the last step."""
    index = _timer["step"]
    if index in (_timer["warmup"], _timer["steps"] - 1):
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        _timer["t0" if index == _timer["warmup"] else "t1"] = time.perf_counter()
    _timer["step"] = index + 1
    if _timer.get("sleep"):
        time.sleep(_timer["sleep"])
    x, y = batch
    loss: torch.Tensor = model(x, y)
    return loss


def eval_step(model: nn.Module, batch: Any, ctx: Any) -> dict[str, torch.Tensor]:
    """Summed loss and count (the loop all-reduces and divides); eagerly, so eval mode costs no recompilation."""
    record_training_peak(ctx.rank)
    x, y = batch
    count = torch.tensor(float(x.shape[0]), device=x.device)
    return {"loss": getattr(model, "_orig_mod", model)(x, y).float() * count, "count": count}


def measured_export(model: nn.Module, model_dir: Path, ctx: Any) -> dict[str, Any]:
    """The entrypoint's own export of ``model`` (every rank of a sharded model takes part); what it cost this
    process: its peak resident set's rise over the resident set before, next to the largest and all tensors."""
    from entrypoint.pytorch.loop.export import SHARDS, WHOLE, export_model

    sharded = any(hasattr(p, "full_tensor") for p in model.parameters())
    sizes = [v.numel() * v.element_size() for v in model.state_dict().values()]  # global shapes
    reset = reset_peak()
    before = status_mib("VmRSS")
    started = time.perf_counter()
    export_model(model, model_dir, None, ctx, SHARDS if sharded else WHOLE)
    seconds = time.perf_counter() - started
    return {"export_rise_mib": status_mib("VmHWM") - before if reset else None, "export_rss_before_mib": before,
            "export_seconds": seconds, "largest_tensor_mib": max(sizes) / MIB, "tensors_mib": sum(sizes) / MIB,
            "tensors": len(sizes), "export_sharded": sharded}


def export(model: nn.Module, model_dir: Path, ctx: Any) -> None:
    """The throughput (and with ``--export`` the measured export; the benchmark needs no model file otherwise)."""
    exported = measured_export(model, model_dir, ctx) if _memory["export"] else {}
    if not ctx.is_chief:
        return
    timed = _timer["steps"] - 1 - _timer["warmup"]
    seconds = max(_timer["t1"] - _timer["t0"], 1e-9)
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    (Path(model_dir) / "bench_timing.json").write_text(json.dumps({
        "tokens_per_second": timed * _timer["tokens"] / seconds, "timed_steps": timed, "seconds": seconds,
        "world_size": ctx.world_size, "params": _timer["params"], "flops_per_token": _timer["flops_per_token"],
        "device": str(ctx.device), "device_name": device_name, **exported,
    }))
