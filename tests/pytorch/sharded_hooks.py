"""The GPT of ``trainers.gpt_torch`` with what the sharded-training tests need (options after ``--``).

``--record DIR``: every rank appends the dataset indices of each training batch to ``DIR/<pid>-rank<r>.txt`` (one
line per step), so a test can check that no sample of an epoch is skipped or seen twice across world sizes.
``--step-sleep``: slows every step so a test can interrupt mid-epoch. ``--big``: wider blocks, for a save slow
enough to be interrupted. ``--hold FILE``: a process that builds its datasets while FILE exists waits until it is
gone (a test holds a lost node's replacement back until the survivors went on without it). ``--units``: a
``shard_units`` hook naming these modules (``--units nope`` names one that is not in the model). ``--sgd``: SGD
instead of AdamW. ``--pause FILE``: a step waits while FILE exists (a test SIGKILLs a node before the next
snapshot). ``--spoil FILE``: once FILE exists, this process changes one value in each peer snapshot it holds of
another rank (a copy corrupted in host memory, in the live job) and writes ``FILE.<rank>``.
"""

from __future__ import annotations

import argparse
import gc
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from trainers import gpt_torch

DEFAULTS = {"epochs": 2, "batch_size": 8}
_state: dict[str, Any] = {}


class Indexed(Dataset[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    """A dataset's items with their index."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, y = self.inner[i]
        return x, y, torch.tensor(i)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The GPT's options plus the tests' own."""
    gpt_torch.add_arguments(parser)
    parser.add_argument("--record", default="")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--hold", default="")
    parser.add_argument("--units", nargs="*", default=None)
    parser.add_argument("--pause", default="")
    parser.add_argument("--spoil", default="")
    parser.add_argument("--sgd", action="store_true", help="SGD instead of AdamW (Adam amplifies the reduction "
                        "order's last-bit noise where a gradient is analytically zero, as the key bias's is)")


def spoil_when(path: Path, rank: int) -> None:
    """Once ``path`` exists: one value of every peer snapshot this process holds of another rank changed in place."""
    from entrypoint.pytorch.recovery.snapshots import PeerSnapshots

    while not path.exists():
        time.sleep(0.05)
    spoiled = []
    with warnings.catch_warnings():  # isinstance on every object touches torch's deprecated aliases
        warnings.simplefilter("ignore")
        found_all = [o for o in gc.get_objects() if isinstance(o, PeerSnapshots)]
    for found in found_all:
        for step, snapshot in sorted(found.held.items()):
            for tensor in snapshot["payload"]["model"].values():  # each: a tied weight's first name is overwritten
                if tensor.numel():  # by its second as the copy is adopted
                    tensor.view(-1)[0] += 1.0
            spoiled.append(step)
    Path(f"{path}.{rank}").write_text(" ".join(map(str, spoiled)))


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[Indexed, Indexed]:
    _state["args"] = args
    if args.spoil:
        threading.Thread(target=spoil_when, args=(Path(args.spoil), ctx.rank), daemon=True).start()
    while args.hold and Path(args.hold).exists():
        time.sleep(0.05)
    train, val = gpt_torch.build_datasets(args, ctx)
    return Indexed(train), Indexed(val)


def build_model(args: argparse.Namespace, ctx: Any) -> nn.Module:
    return gpt_torch.build_model(args, ctx)


def build_optimizer(model: nn.Module, args: argparse.Namespace, ctx: Any) -> torch.optim.Optimizer:
    if args.sgd:
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return gpt_torch.build_optimizer(model, args, ctx)


def shard_units(model: nn.Module, ctx: Any) -> list[Any]:
    """The ``--units`` names, or every block (what the default picks too)."""
    units = _state["args"].units
    return list(units) if units is not None else list(model.blocks)  # type: ignore[arg-type, union-attr]


def compute_loss(model: nn.Module, batch: Any, ctx: Any) -> torch.Tensor:
    args = _state["args"]
    x, y, index = batch
    if args.record:
        with (Path(args.record) / f"{os.getpid()}-rank{ctx.rank}.txt").open("a") as f:
            f.write(" ".join(str(int(i)) for i in index) + "\n")
    if args.step_sleep:
        time.sleep(args.step_sleep)
    while args.pause and Path(args.pause).exists():
        time.sleep(0.05)
    loss: torch.Tensor = model(x, y)
    return loss


def eval_step(model: nn.Module, batch: Any, ctx: Any) -> dict[str, torch.Tensor]:
    x, y, _ = batch
    count = torch.tensor(float(x.shape[0]), device=x.device)
    return {"loss": model(x, y).float() * count, "count": count}
