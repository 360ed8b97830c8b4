"""Flowers CNN from the Vertex AI multi-worker codelab, as a hooks module: one subfolder of images per class.

Without --data-dir it first writes a small labelled image folder of its own (3 classes of 32x32 PNGs
with class-dependent stripes) into the temp dir, so the real loading path runs with no download.

    # one node (default strategy, or MirroredStrategy with several GPUs)
    python -m entrypoint run --framework tensorflow --module trainers.flowers_keras --epochs 3
    # two emulated Vertex replicas on this machine (MultiWorkerMirroredStrategy)
    python -m entrypoint local --workers 2 -- run --framework tensorflow --module trainers.flowers_keras
    # Vertex AI: the TensorFlow image (its ENTRYPOINT already ends in `run`) with container args
    #   --args=--module=trainers.flowers_keras,--,--data-dir=/gcs/BUCKET/flower_photos,--image-size=180
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

DEFAULTS = {"epochs": 5, "batch_size": 16}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This module's own arguments (what follows ``--``)."""
    parser.add_argument("--data-dir", help="image folder, one subfolder per class (default: generate one)")
    parser.add_argument("--image-size", type=int, default=64, help="images are resized to this square (codelab: 180)")
    parser.add_argument("--images-per-class", type=int, default=40, help="when generating the folder")


def make_image_folder(root: Path, classes: int = 3, per_class: int = 40, size: int = 32, seed: int = 0) -> Path:
    """Write ``classes`` subfolders of PNGs: noise plus bright stripes whose spacing and colour depend on the class."""
    rng = np.random.default_rng(seed)
    for label in range(classes):
        folder = root / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            image = rng.integers(0, 96, size=(size, size, 3), dtype=np.uint8)
            image[:: label + 2, :, label % 3] = 255
            tf.io.write_file(str(folder / f"{i:04d}.png"), tf.io.encode_png(image))
    return root


def data_dir(args: argparse.Namespace) -> Path:
    """--data-dir, else a generated folder in this replica's temp dir (made once, then reused)."""
    if args.data_dir:
        return Path(args.data_dir)
    root = Path(tempfile.gettempdir()) / f"flowers_keras_generated_{args.images_per_class}"
    if not (root / "DONE").exists():
        make_image_folder(root, per_class=args.images_per_class)
        (root / "DONE").write_text("")
    return root


def build_model(args: argparse.Namespace, ctx: Any) -> Any:
    """The codelab's CNN (the entrypoint calls this inside strategy.scope())."""
    num_classes = sum(1 for p in data_dir(args).iterdir() if p.is_dir())
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(args.image_size, args.image_size, 3)),
        tf.keras.layers.Rescaling(1.0 / 255),
        tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(num_classes, activation="softmax"),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(), loss=tf.keras.losses.SparseCategoricalCrossentropy(),
                  metrics=["accuracy"])
    return model


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[Any, Any]:
    """Unbatched (image, label) datasets, 80/20 split; the entrypoint batches and shards them."""
    common = {"validation_split": 0.2, "seed": 123, "image_size": (args.image_size, args.image_size),
              "batch_size": None}
    train = tf.keras.utils.image_dataset_from_directory(str(data_dir(args)), subset="training", **common)
    val = tf.keras.utils.image_dataset_from_directory(str(data_dir(args)), subset="validation", **common)
    return train.cache(), val.cache()
