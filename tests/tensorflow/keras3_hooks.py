"""``tests.tensorflow.toy_hooks`` written with Keras 3 (``import keras``): the hooks loop refuses its model."""

from __future__ import annotations

import argparse
from typing import Any

import keras

from tests.tensorflow.toy_hooks import DEFAULTS, add_arguments, build_datasets

__all__ = ["DEFAULTS", "add_arguments", "build_datasets", "build_model"]


def build_model(args: argparse.Namespace, ctx: Any) -> Any:
    model = keras.Sequential([keras.Input(shape=(8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model
