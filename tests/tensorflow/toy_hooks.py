"""A tiny hooks module for the TensorFlow tests: two-class points, a small dense network."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import tensorflow as tf

DEFAULTS = {"epochs": 2, "batch_size": 16}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=256, help="training examples (eval gets a quarter)")


def build_model(args: argparse.Namespace, ctx: Any) -> Any:
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(8,)),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(2),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[Any, Any]:
    rng = np.random.default_rng(0)
    n = args.samples + args.samples // 4
    x = rng.normal(size=(n, 8)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int64")
    data = tf.data.Dataset.from_tensor_slices((x, y))
    return data.take(args.samples), data.skip(args.samples)
