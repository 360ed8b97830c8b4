"""A tiny model for ``--compile``'s caches (tests/pytorch/test_compile_cache.py): what torch.compile took from them.

Its ``export`` hook writes ``compile_counters.json`` into the model dir: Inductor's FX graph cache and AOTAutograd's
cache hits and misses in this process (a process that loaded the job's compile cache on a fresh disk hits), and the
kernel files of Inductor's cache directory when training ended.
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
from torch.utils.data import TensorDataset

DEFAULTS = {"epochs": 1, "batch_size": 8}
_sleep = {"seconds": 0.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds each step takes longer")


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, args.width, generator=g)
    y = (x.sum(dim=1) > 0).long()
    return TensorDataset(x, y), TensorDataset(x[:8], y[:8])


class Net(nn.Module):
    """Two layers. A class of its own: under DDP torch.compile traces the model's own forward, and dynamo does not
    start tracing in torch.nn's code (a bare ``nn.Sequential`` would compile nothing there)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.hidden, self.out = nn.Linear(width, width), nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


def build_model(args: argparse.Namespace, ctx: Any) -> nn.Module:
    _sleep["seconds"] = args.step_sleep
    return Net(args.width)


def compute_loss(model: nn.Module, batch: Any, ctx: Any) -> torch.Tensor:
    x, y = batch
    if model.training:
        time.sleep(_sleep["seconds"])
    return nn.functional.cross_entropy(model(x), y)


def export(model: nn.Module, model_dir: Any, ctx: Any) -> None:
    from torch._dynamo.utils import counters
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    kernels = sorted(p.name for p in Path(cache_dir()).rglob("*.so"))
    found = {"inductor": dict(counters["inductor"]), "aot_autograd": dict(counters["aot_autograd"]),
             "kernels": kernels, "cache_dir": cache_dir(), "pid": os.getpid()}
    Path(model_dir).mkdir(parents=True, exist_ok=True)
    (Path(model_dir) / "compile_counters.json").write_text(json.dumps(found, indent=1))
