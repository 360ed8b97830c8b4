"""A small Keras 3 hooks module for the JAX tests: synthetic data, an MLP with dropout (its seed generator's state is
part of the checkpoint), and ``--sleep`` seconds of host time in every step (a debug callback) so a test can stop it
mid-epoch."""

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


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[Any, Any]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.rows + 64, 8)).astype("float32")
    y = (x.sum(1) > 0).astype("int32")
    return (x[:args.rows], y[:args.rows]), (x[args.rows:], y[args.rows:])


class Pause(keras.layers.Layer):
    """Identity, plus ``seconds`` of host time each time it runs (a slow step, without changing the math)."""

    def __init__(self, seconds: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seconds = seconds

    def call(self, inputs: Any) -> Any:
        if self.seconds:
            jax.debug.callback(lambda: time.sleep(self.seconds))
        return inputs

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "seconds": self.seconds}


def build_model(args: argparse.Namespace, ctx: Any) -> keras.Model:
    model = keras.Sequential([keras.Input((8,)), Pause(args.sleep), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(0.2), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model
