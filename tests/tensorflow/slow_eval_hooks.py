"""The toy hooks module with a slow validation pass, so a test can stop a job while it validates.

Each validation pass prints ``validation pass begins`` when its first example is read, then takes ``--eval-pause``
seconds per example (``--samples`` // 4 of them). ``--marker`` only puts a recognisable word on every replica's
command line.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import tensorflow as tf

from tests.tensorflow.toy_hooks import build_datasets as toy_datasets
from tests.tensorflow.toy_hooks import build_model

__all__ = ["DEFAULTS", "add_arguments", "build_datasets", "build_model"]

DEFAULTS = {"epochs": 4, "batch_size": 16}
BEGINS = "validation pass begins"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=256, help="training examples (eval gets a quarter)")
    parser.add_argument("--eval-pause", type=float, default=0.05, help="seconds per validation example")
    parser.add_argument("--marker", default="", help="ignored: a word for the command line")


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[Any, Any]:
    train, evaluation = toy_datasets(args, ctx)
    passes = [0]

    def pause(index: Any, x: Any, y: Any) -> tuple[Any, Any]:
        if int(index) == 0:
            passes[0] += 1
            print(f"{BEGINS} ({passes[0]}) in pid {os.getpid()}", flush=True)
        time.sleep(args.eval_pause)
        return x, y

    def slow(index: Any, example: Any) -> tuple[Any, Any]:
        x, y = example
        x2, y2 = tf.numpy_function(pause, [index, x, y], (tf.float32, tf.int64), stateful=True)
        return tf.ensure_shape(x2, (8,)), tf.ensure_shape(y2, ())

    return train, evaluation.enumerate().map(lambda i, e: slow(i, e))
