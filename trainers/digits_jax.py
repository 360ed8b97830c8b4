"""Handwritten digits (scikit-learn's bundled 8x8 images) with a small Keras 3 MLP on JAX, in the hooks style.

Launch on a 2-replica emulated Vertex cluster:

    python -m entrypoint local --workers 2 -- run --framework jax --module trainers.digits_jax

or on Vertex AI with the JAX image: ``--args=--module=trainers.digits_jax``. The entrypoint owns the loop
(jax.distributed, Keras' DataParallel, each process's share of every batch, Orbax checkpoints, the export,
hypertune); this file only says what to train.
"""

from __future__ import annotations

import argparse
from typing import Any

import keras
import numpy as np

from trainers.digits_data import load_digits

DEFAULTS = {"epochs": 15, "batch_size": 32}
HYPERTUNE_METRIC = "val_accuracy"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Model hyperparameters (everything after ``--`` on the command line)."""
    parser.add_argument("--lr", type=float, default=0.01, help="Adam learning rate")
    parser.add_argument("--hidden", type=int, default=128, help="hidden units")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--val-fraction", type=float, default=0.2)


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """1797 8x8 digit images shipped inside scikit-learn, split once with a fixed seed: (x, y) NumPy arrays."""
    pixels, labels = load_digits()
    x, y = (pixels / 16.0).astype("float32"), labels.astype("int32")
    order = np.random.default_rng(0).permutation(len(x))
    cut = int(len(x) * (1 - args.val_fraction))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def build_model(args: argparse.Namespace, ctx: Any) -> keras.Model:
    """A compiled Keras 3 MLP (built under the distribution the entrypoint set: its variables are laid out)."""
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(args.hidden, activation="relu"),
        keras.layers.Dropout(args.dropout),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(args.lr),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model
