"""The toy hooks module with a slow validation pass, so a test can stop a job while it validates.

Each validation pass prints ``validation pass begins (N) in pid P`` when its first example is read (N counts this
process's passes), then takes ``--eval-pause`` seconds per example: ``--samples`` // 4 of them, ``--eval-repeat`` times
over. The data is never shuffled, so a job resumed at an epoch's end trains what an uninterrupted one does.
``--resumed-eval-pause`` replaces ``--eval-pause`` in the first pass of a process that starts with a committed
checkpoint in its job's checkpoint dir: a restart after a stop in a pass validates the restored epoch again first,
and a test that stops it only in a later pass need not wait for that one.
``--export-sleep`` makes the model's ``save`` (the entrypoint's export) print ``export: sleeping`` and take that many
seconds more. ``--marker`` only puts a recognisable word on every replica's command line.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import tensorflow as tf

from entrypoint.outputs.checkpoints import committed
from tests.tensorflow.toy_hooks import build_datasets as toy_datasets
from tests.tensorflow.toy_hooks import build_model as toy_model

__all__ = ["DEFAULTS", "add_arguments", "build_datasets", "build_model"]

DEFAULTS = {"epochs": 4, "batch_size": 16}
BEGINS = "validation pass begins"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=256, help="training examples (eval gets a quarter)")
    parser.add_argument("--eval-pause", type=float, default=0.05, help="seconds per validation example")
    parser.add_argument("--eval-repeat", type=int, default=1, help="passes over the validation examples per validation")
    parser.add_argument("--resumed-eval-pause", type=float, default=None,
                        help="seconds per validation example in a resumed process's first pass (default --eval-pause)")
    parser.add_argument("--export-sleep", type=float, default=0.0, help="seconds the export takes more")
    parser.add_argument("--marker", default="", help="ignored: a word for the command line")


def build_model(args: argparse.Namespace, ctx: Any) -> Any:
    model = toy_model(args, ctx)
    if args.export_sleep:
        save = model.save

        def slow_save(*a: Any, **k: Any) -> Any:
            print(f"export: sleeping {args.export_sleep:g} s", flush=True)
            time.sleep(args.export_sleep)
            return save(*a, **k)

        model.save = slow_save
    return model


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[Any, Any]:
    train, evaluation = toy_datasets(args, ctx)
    resumed = args.resumed_eval_pause is not None and bool(committed(ctx.checkpoint_dir, warn=False))
    passes, seconds = [0], [args.eval_pause]

    def pause(index: Any, x: Any, y: Any) -> tuple[Any, Any]:
        if int(index) == 0:
            passes[0] += 1
            seconds[0] = args.resumed_eval_pause if resumed and passes[0] == 1 else args.eval_pause
            print(f"{BEGINS} ({passes[0]}) in pid {os.getpid()}", flush=True)
        time.sleep(seconds[0])
        return x, y

    def slow(index: Any, example: Any) -> tuple[Any, Any]:
        x, y = example
        x2, y2 = tf.numpy_function(pause, [index, x, y], (tf.float32, tf.int64), stateful=True)
        return tf.ensure_shape(x2, (8,)), tf.ensure_shape(y2, ())

    return train, evaluation.repeat(args.eval_repeat).enumerate().map(lambda i, e: slow(i, e))
