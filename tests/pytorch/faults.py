"""The digits hooks, misbehaving on request (options after ``--``), for the failure and preemption tests.

``--fault raise`` raises at ``--at-step`` with every secret it can reach in the message; ``--fault exit``
calls ``sys.exit(0)`` in ``build_model``; ``--fault hang-building`` never returns from ``build_datasets`` (on
``--fault-replica`` only, if given); ``--eval-samples N`` keeps N evaluation samples; ``--fault hang`` blocks
rank 0 at ``--at-step``; ``--fault nan`` makes the loss NaN from ``--at-step`` on (``nan-once``: at that step
only), on ``--fault-rank`` (default: every rank);
``--step-sleep`` slows every step so a test can interrupt mid-epoch; ``--build-sleep`` makes ``build_model`` take that
many seconds (a large model's load, a slow start), ``--first-step-sleep`` the first step (its first imports on a
loaded machine); ``--blob-a/--blob-b`` are echoed back by length.

The slow phases a stop may come in (each says so on stdout when it starts): ``--eval-sleep S`` each evaluation batch
(``eval_step``); ``--read-sleep S`` each sample and ``--read-block S`` once, read for the batch after
``--slow-read-at`` steps of this process (a slow remote dataset; the loop reads on CPU in the training process;
on ``--fault-replica`` and ``--fault-rank`` only, if given);
``--restore-sleep S`` the restore's read of a checkpoint; ``--save-sleep S`` each checkpoint's write. None changes
what is trained.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, Subset

from entrypoint.pytorch.defaults import default_eval_step
from trainers import digits_torch

DEFAULTS = {"epochs": 2, "batch_size": 32}
build_optimizer = digits_torch.build_optimizer
_state: dict[str, Any] = {"steps": 0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The digits options plus the faults."""
    digits_torch.add_arguments(parser)
    parser.add_argument("--fault", choices=["none", "raise", "exit", "hang", "nan", "nan-once", "hang-building"],
                        default="none")
    parser.add_argument("--fault-replica", default="", help="only this replica (TRAINER_REPLICA) misbehaves")
    parser.add_argument("--eval-samples", type=int, default=0, help="keep only this many evaluation samples")
    parser.add_argument("--fault-rank", type=int, default=-1)
    parser.add_argument("--at-step", type=int, default=5)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--build-sleep", type=float, default=0.0, help="seconds build_model takes (a slow start)")
    parser.add_argument("--first-step-sleep", type=float, default=0.0, help="seconds the first step takes longer")
    parser.add_argument("--export-delay", type=float, default=0.0, help="seconds the export waits before writing")
    parser.add_argument("--eval-sleep", type=float, default=0.0, help="seconds each evaluation batch takes")
    parser.add_argument("--slow-read-at", type=int, default=-1, help="the batch read after this many steps is slow")
    parser.add_argument("--read-sleep", type=float, default=0.0, help="seconds each sample of that batch takes")
    parser.add_argument("--read-block", type=float, default=0.0, help="seconds that batch's read blocks once")
    parser.add_argument("--restore-sleep", type=float, default=0.0, help="seconds the restore's read takes")
    parser.add_argument("--save-sleep", type=float, default=0.0, help="seconds each checkpoint write takes")
    parser.add_argument("--hidden-on-restart", type=int, default=0, help="a different model in w1-1 restart 1")
    parser.add_argument("--record-batches", action="store_true", help="each rank appends a digest of every batch")
    parser.add_argument("--api-token", default="")
    parser.add_argument("--blob-a", default="")
    parser.add_argument("--blob-b", default="")


class SlowReads(Dataset[Any]):
    """The training set, read slowly for the batch after ``--slow-read-at`` steps (``--read-sleep``,
    ``--read-block``)."""

    def __init__(self, dataset: Any, args: argparse.Namespace, rank: int) -> None:
        self.dataset, self.args, self.blocked = dataset, args, False
        self.here = args.fault_replica in ("", os.environ.get("TRAINER_REPLICA")) and args.fault_rank in (-1, rank)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        args = self.args
        if _state["steps"] == args.slow_read_at and self.here:
            if not self.blocked:
                self.blocked = True
                print(f"slow read: the batch after step {args.slow_read_at} of this process", flush=True)
                time.sleep(args.read_block)
            time.sleep(args.read_sleep)
        return self.dataset[index]


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[Any, Any]:
    """The digits; ``--fault hang-building`` never returns (on ``--fault-replica``, else everywhere)."""
    if args.fault == "hang-building" and args.fault_replica in ("", os.environ.get("TRAINER_REPLICA")):
        print("build_datasets: sleeping forever", flush=True)
        while True:
            time.sleep(3600)
    train, val = digits_torch.build_datasets(args, ctx)
    if args.slow_read_at >= 0:
        train = SlowReads(train, args, ctx.rank)
    return train, (Subset(val, range(args.eval_samples)) if args.eval_samples else val)


def _slowed(call: Any, seconds: float, what: str, applies: Any) -> Any:
    """``call`` taking ``seconds`` longer where ``applies(*args)``, saying so."""
    def slow(*args: Any, **kwargs: Any) -> Any:
        if applies(*args):
            print(f"{what}: sleeping {seconds:g} s", flush=True)
            time.sleep(seconds)
        return call(*args, **kwargs)

    return slow


def _slow_io(args: argparse.Namespace) -> None:
    """``--restore-sleep``: reading a checkpoint's state is slow; ``--save-sleep``: writing one (a slow bucket)."""
    if args.restore_sleep and not getattr(torch.load, "slowed", False):
        torch.load = _slowed(torch.load, args.restore_sleep, "restore", lambda f, *_: "ckpt-" in str(f))
        torch.load.slowed = True  # type: ignore[attr-defined]
    if args.save_sleep and not getattr(torch.save, "slowed", False):
        torch.save = _slowed(torch.save, args.save_sleep, "checkpoint write", lambda _obj, f, *_: not isinstance(
            f, (str, Path)))  # the checkpoint writer hands torch.save a file object; the export a path
        torch.save.slowed = True  # type: ignore[attr-defined]


def build_model(args: argparse.Namespace, ctx: Any) -> nn.Module:
    """The digits MLP; or ``sys.exit(0)`` when asked to fail here."""
    if args.fault == "exit":
        sys.exit(0)
    if args.build_sleep:
        print(f"build_model: sleeping {args.build_sleep:g} s", flush=True)
        time.sleep(args.build_sleep)
    _state["args"] = args
    _slow_io(args)
    restart = (os.environ.get("TRAINER_REPLICA"), os.environ.get("TRAINER_RESTART_COUNT", "0"))
    if args.hidden_on_restart and restart == ("workerpool1-1", "1"):
        args.hidden = args.hidden_on_restart  # workerpool1-1's first replacement: built from other code
    if ctx.is_chief and (args.blob_a or args.blob_b):
        ctx.model_dir.mkdir(parents=True, exist_ok=True)
        (ctx.model_dir / "blobs.json").write_text(json.dumps({"a": len(args.blob_a), "b": len(args.blob_b)}))
    return digits_torch.build_model(args, ctx)


def export(model: nn.Module, model_dir: Path, ctx: Any) -> None:
    """The default export, after ``--export-delay`` seconds (a window after the last commit, before the export); a
    sharded model's ranks each save their shards' state dict."""
    args = _state["args"]
    if args.export_delay:
        print(f"exporting in {args.export_delay:g} s", flush=True)
        time.sleep(args.export_delay)
    model_dir.mkdir(parents=True, exist_ok=True)
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):  # sharded: every rank exports its shards
        torch.save(model.state_dict(), model_dir / f"state_dict-rank{ctx.rank}.pt")  # (FSDP's classes do not pickle)
        print(f"exported to {model_dir}", flush=True)
        return
    torch.save(model.state_dict(), model_dir / "state_dict.pt")
    torch.save(model, model_dir / "model.pt")
    print(f"exported to {model_dir}", flush=True)


def eval_step(model: nn.Module, batch: Any, ctx: Any) -> dict[str, torch.Tensor]:
    """The classification metrics, each batch ``--eval-sleep`` seconds slower."""
    args = _state["args"]
    if args.eval_sleep:
        if not _state.get("evaluating"):
            print(f"evaluating slowly after step {_state['steps']} of this process: {args.eval_sleep:g} s a batch",
                  flush=True)
        _state["evaluating"] = True
        time.sleep(args.eval_sleep)
    return default_eval_step(model, batch, ctx)


def compute_loss(model: nn.Module, batch: Any, ctx: Any) -> Any:
    """Cross-entropy, after the requested fault or pause."""
    args = _state["args"]
    _state["steps"] += 1
    _state["evaluating"] = False
    if _state["steps"] == args.at_step and args.fault == "raise" and args.fault_replica in (
            "", os.environ.get("TRAINER_REPLICA")):
        secrets = " ".join(os.environ.get(n, "") for n in ("WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY"))
        raise ValueError(f"cannot reach the tracker with token {args.api_token} ({secrets})")
    if _state["steps"] == args.at_step and args.fault == "hang" and ctx.rank == 0:
        time.sleep(3600)
    if args.step_sleep:
        time.sleep(args.step_sleep)
    if _state["steps"] == 1 and args.first_step_sleep:
        time.sleep(args.first_step_sleep)
    inputs, labels = batch
    if args.record_batches:
        record = ctx.model_dir.parent / "batches" / f"rank{ctx.rank}.txt"
        record.parent.mkdir(parents=True, exist_ok=True)
        with record.open("a") as f:
            f.write(hashlib.sha256(inputs.numpy().tobytes() + labels.numpy().tobytes()).hexdigest()[:12] + "\n")
    loss = F.cross_entropy(model(inputs), labels)
    poisoned = _state["steps"] >= args.at_step if args.fault == "nan" else _state["steps"] == args.at_step
    if args.fault in ("nan", "nan-once") and poisoned and args.fault_rank in (-1, ctx.rank):
        loss = loss * float("nan")
    return loss
