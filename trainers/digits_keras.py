"""A Keras script as the Keras and TensorFlow multi-worker guides write it, run unchanged (script mode):
scikit-learn's bundled digits, a small dense network built and compiled in ``strategy.scope()``, ``model.fit``.

Keras 3 (``import keras``, the default here) trains on one node. Across nodes write ``import tf_keras as keras``
(here ``--tf-keras``): with TensorFlow 2.21 Keras 3's ``fit`` cannot train across workers, and the entrypoint
refuses it on every replica with one line before anything trains (docs/tensorflow.md#keras-3-or-tf-keras).

    python -m entrypoint run --framework tensorflow --module trainers.digits_keras
    python -m entrypoint local --workers 2 -- run --framework tensorflow --module trainers.digits_keras -- --tf-keras

It reaches about 0.95 validation accuracy with the defaults; the chief saves ``<model_dir>/model.keras``.
"""

import argparse
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from entrypoint import context
from trainers.digits_data import load_digits

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--tf-keras", action="store_true", help="tf-keras (Keras 2), which trains across nodes")
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=32, help="per replica")
args = parser.parse_args()

if args.tf_keras:
    import tf_keras as keras  # across nodes
else:
    import keras  # Keras 3: one node

# One worker without a cluster; the workers TF_CONFIG names (the entrypoint exports it) across nodes.
strategy = tf.distribute.MultiWorkerMirroredStrategy()
pixels, labels = load_digits()  # scikit-learn's load_digits(return_X_y=True), without importing scikit-learn
x, y = (pixels / 16.0).astype("float32"), labels.astype("int64")
order = np.random.default_rng(0).permutation(len(x))
train, val = order[:1440], order[1440:]
global_batch = args.batch_size * strategy.num_replicas_in_sync
train_data = tf.data.Dataset.from_tensor_slices((x[train], y[train])).shuffle(1440, seed=0).repeat().batch(global_batch)
val_data = tf.data.Dataset.from_tensor_slices((x[val], y[val])).batch(global_batch)

with strategy.scope():
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

history = model.fit(train_data, epochs=args.epochs, steps_per_epoch=len(train) // global_batch,
                    validation_data=val_data, verbose=2)
# Every worker saves (TensorFlow may run collectives while saving); only the chief's copy is kept.
target = context.model_dir() if context.is_chief() else tempfile.mkdtemp(prefix="workertemp_")
os.makedirs(target, exist_ok=True)
model.save(os.path.join(target, "model.keras"))
if not context.is_chief():
    shutil.rmtree(target, ignore_errors=True)
print(f"{keras.__name__} {keras.__version__}: val_accuracy {history.history['val_accuracy'][-1]:.3f}")
