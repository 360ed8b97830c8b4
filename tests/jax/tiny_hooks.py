"""A small Keras 3 hooks module for the JAX tests: synthetic data, an MLP with dropout (its seed generator's state is
part of the checkpoint), and ``--sleep`` seconds of host time in every step (a debug callback) so a test can stop it
mid-epoch. So a test can stop it in the other phases: ``--eval-sleep`` seconds in every evaluation batch, each printing
``evaluation batch``; ``--build-sleep`` seconds in ``build_model`` after ``build_model: sleeping``; ``--export-sleep``
seconds more in the model's ``save`` (the entrypoint's export) after ``export: sleeping``; ``--read-sleep`` seconds in
every read of training rows (a slow disk: the loop reads a batch's rows a part at a time). None changes the math."""

from __future__ import annotations

import argparse
import time
from typing import Any

import jax
import keras
import numpy as np

DEFAULTS = {"batch_size": 8, "epochs": 2}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--marker", default="")
    parser.add_argument("--eval-sleep", type=float, default=0.0)
    parser.add_argument("--build-sleep", type=float, default=0.0)
    parser.add_argument("--export-sleep", type=float, default=0.0)
    parser.add_argument("--read-sleep", type=float, default=0.0)


class SlowRows(np.ndarray):
    """An array whose reads of rows by index (the loop's) take ``delay`` seconds each."""

    delay = 0.0

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, np.ndarray):
            time.sleep(SlowRows.delay)
        return np.asarray(super().__getitem__(index))


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[Any, Any]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.rows + 64, 8)).astype("float32")
    y = (x.sum(1) > 0).astype("int32")
    train_x = x[:args.rows]
    if args.read_sleep:
        SlowRows.delay = args.read_sleep
        train_x = train_x.view(SlowRows)
    return (train_x, y[:args.rows]), (x[args.rows:], y[args.rows:])


def evaluation_pause(seconds: float) -> None:
    print("evaluation batch", flush=True)
    time.sleep(seconds)


class Pause(keras.layers.Layer):
    """Identity, plus ``seconds`` of host time each time it trains and ``eval_seconds`` each time it evaluates (a slow
    step, without changing the math)."""

    def __init__(self, seconds: float, eval_seconds: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seconds, self.eval_seconds = seconds, eval_seconds

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        if training and self.seconds:
            jax.debug.callback(lambda: time.sleep(self.seconds))
        if not training and self.eval_seconds:
            jax.debug.callback(lambda: evaluation_pause(self.eval_seconds))
        return inputs

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "seconds": self.seconds, "eval_seconds": self.eval_seconds}


def build_model(args: argparse.Namespace, ctx: Any) -> keras.Model:
    if args.build_sleep:
        print("build_model: sleeping", flush=True)
        time.sleep(args.build_sleep)
    model = keras.Sequential([keras.Input((8,)), Pause(args.sleep, args.eval_sleep),
                              keras.layers.Dense(16, activation="relu"), keras.layers.Dropout(0.2),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    if args.export_sleep:
        save = model.save

        def slow_save(*a: Any, **k: Any) -> Any:
            print("export: sleeping", flush=True)
            time.sleep(args.export_sleep)
            return save(*a, **k)

        model.save = slow_save
    return model
