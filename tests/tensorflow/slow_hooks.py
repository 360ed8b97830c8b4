"""The toy hooks module with a pause per training example, so a test can signal the job mid-epoch.

``--marker`` only puts a recognisable word on every replica's command line (tests look for leftovers);
``--build-sleep`` makes ``build_model`` take that many seconds (a slow start).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import tensorflow as tf

from tests.tensorflow.toy_hooks import build_datasets as toy_datasets
from tests.tensorflow.toy_hooks import build_model as toy_model

__all__ = ["DEFAULTS", "add_arguments", "build_datasets", "build_model"]

DEFAULTS = {"epochs": 4, "batch_size": 16}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=512, help="training examples (eval gets a quarter)")
    parser.add_argument("--pause", type=float, default=0.004, help="seconds per training example")
    parser.add_argument("--marker", default="", help="ignored: a word for the command line")
    parser.add_argument("--build-sleep", type=float, default=0.0, help="seconds build_model takes (a slow start)")


def build_model(args: argparse.Namespace, ctx: Any) -> Any:
    if args.build_sleep:
        print(f"build_model: sleeping {args.build_sleep:g} s", flush=True)
        time.sleep(args.build_sleep)
    return toy_model(args, ctx)


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[Any, Any]:
    train, evaluation = toy_datasets(args, ctx)

    def pause(x: Any, y: Any) -> tuple[Any, Any]:
        time.sleep(args.pause)
        return x, y

    def slow(x: Any, y: Any) -> tuple[Any, Any]:
        x2, y2 = tf.numpy_function(pause, [x, y], (tf.float32, tf.int64), stateful=True)
        return tf.ensure_shape(x2, (8,)), tf.ensure_shape(y2, ())

    return train.map(slow), evaluation
