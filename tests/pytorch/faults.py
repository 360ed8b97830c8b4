"""The digits hooks, misbehaving on request (options after ``--``), for the failure and preemption tests.

``--fault raise`` raises at ``--at-step`` with every secret it can reach in the message; ``--fault exit``
calls ``sys.exit(0)`` in ``build_model``; ``--fault hang-building`` never returns from ``build_datasets`` (on
``--fault-replica`` only, if given); ``--eval-samples N`` keeps N evaluation samples; ``--fault hang`` blocks
rank 0 at ``--at-step``; ``--fault nan`` makes the loss NaN from ``--at-step`` on (``nan-once``: at that step
only), on ``--fault-rank`` (default: every rank);
``--step-sleep`` slows every step so a test can interrupt mid-epoch; ``--build-sleep`` makes ``build_model`` take that
many seconds (a large model's load, a slow start), ``--first-step-sleep`` the first step (its first imports on a
loaded machine); ``--blob-a/--blob-b`` are echoed back by length.
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
from torch.utils.data import Subset

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
    parser.add_argument("--hidden-on-restart", type=int, default=0, help="a different model in w1-1 restart 1")
    parser.add_argument("--record-batches", action="store_true", help="each rank appends a digest of every batch")
    parser.add_argument("--api-token", default="")
    parser.add_argument("--blob-a", default="")
    parser.add_argument("--blob-b", default="")


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[Any, Any]:
    """The digits; ``--fault hang-building`` never returns (on ``--fault-replica``, else everywhere)."""
    if args.fault == "hang-building" and args.fault_replica in ("", os.environ.get("TRAINER_REPLICA")):
        print("build_datasets: sleeping forever", flush=True)
        while True:
            time.sleep(3600)
    train, val = digits_torch.build_datasets(args, ctx)
    return train, (Subset(val, range(args.eval_samples)) if args.eval_samples else val)


def build_model(args: argparse.Namespace, ctx: Any) -> nn.Module:
    """The digits MLP; or ``sys.exit(0)`` when asked to fail here."""
    if args.fault == "exit":
        sys.exit(0)
    if args.build_sleep:
        print(f"build_model: sleeping {args.build_sleep:g} s", flush=True)
        time.sleep(args.build_sleep)
    _state["args"] = args
    restart = (os.environ.get("TRAINER_REPLICA"), os.environ.get("TRAINER_RESTART_COUNT", "0"))
    if args.hidden_on_restart and restart == ("workerpool1-1", "1"):
        args.hidden = args.hidden_on_restart  # workerpool1-1's first replacement: built from other code
    if ctx.is_chief and (args.blob_a or args.blob_b):
        ctx.model_dir.mkdir(parents=True, exist_ok=True)
        (ctx.model_dir / "blobs.json").write_text(json.dumps({"a": len(args.blob_a), "b": len(args.blob_b)}))
    return digits_torch.build_model(args, ctx)


def export(model: nn.Module, model_dir: Path, ctx: Any) -> None:
    """The default export, after ``--export-delay`` seconds (a window after the last commit, before the export)."""
    args = _state["args"]
    if args.export_delay:
        print(f"exporting in {args.export_delay:g} s", flush=True)
        time.sleep(args.export_delay)
    model_dir.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), model_dir / "state_dict.pt")
    torch.save(model, model_dir / "model.pt")
    print(f"exported to {model_dir}", flush=True)


def compute_loss(model: nn.Module, batch: Any, ctx: Any) -> Any:
    """Cross-entropy, after the requested fault or pause."""
    args = _state["args"]
    _state["steps"] += 1
    if _state["steps"] == args.at_step and args.fault == "raise":
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
