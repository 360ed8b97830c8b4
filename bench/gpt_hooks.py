"""The GPT of ``bench.gpt`` as an entrypoint hooks module: the entrypoint owns the loop, this file says what to train.

    python -m entrypoint run --framework pytorch --module bench.gpt_hooks --batch-size 8 \
        -- --config tiny --steps 50 --batch 8

Same model, data and optimizer as the hand-written ``bench/ddp_loop.py``. ``compute_loss`` times the
loop between the start of step ``--warmup`` and the start of the last step (where the hand loop times
itself); the ``export`` hook writes that throughput to ``<model_dir>/bench_timing.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from bench.gpt import CONFIGS, GPT, configure_optimizer, corpus, window

DEFAULTS = {"epochs": 1, "batch_size": 8}
_timer: dict[str, Any] = {"step": 0, "t0": 0.0, "t1": 0.0}


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


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[TokenWindows, TokenWindows]:
    """Exactly ``--steps`` steps of windows for every replica, and one batch per replica to evaluate."""
    cfg = CONFIGS[args.config]
    data = corpus(cfg.vocab_size, args.corpus_tokens)
    _timer.update(steps=args.steps, warmup=args.warmup, tokens=args.batch * cfg.block_size * ctx.world_size)
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
    x, y = batch
    loss: torch.Tensor = model(x, y)
    return loss


def eval_step(model: nn.Module, batch: Any, ctx: Any) -> dict[str, torch.Tensor]:
    """Summed loss and count (the loop all-reduces and divides); eagerly, so eval mode costs no recompilation."""
    x, y = batch
    count = torch.tensor(float(x.shape[0]), device=x.device)
    return {"loss": getattr(model, "_orig_mod", model)(x, y).float() * count, "count": count}


def export(model: nn.Module, model_dir: Path, ctx: Any) -> None:
    """Only the throughput (the benchmark needs no model file)."""
    timed = _timer["steps"] - 1 - _timer["warmup"]
    seconds = max(_timer["t1"] - _timer["t0"], 1e-9)
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    (Path(model_dir) / "bench_timing.json").write_text(json.dumps({
        "tokens_per_second": timed * _timer["tokens"] / seconds, "timed_steps": timed, "seconds": seconds,
        "world_size": ctx.world_size, "params": _timer["params"], "flops_per_token": _timer["flops_per_token"],
        "device": str(ctx.device), "device_name": device_name,
    }))
