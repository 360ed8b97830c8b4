"""An unmodified Horovod Keras example in the style of Horovod's tensorflow2_keras_mnist.py and
keras_imagenet_resnet50.py: DistributedOptimizer and every horovod.tensorflow.keras callback, on generated
MNIST-shaped data. Rank 0 writes what each rank saw to --out/callbacks.json."""

import argparse
import json
import os

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

WARMUP_EPOCHS = 2
EPOCHS = 5


class RecordLearningRate(tf.keras.callbacks.Callback):
    """The optimizer's learning rate at the end of each epoch, as the Horovod callbacks left it."""

    def __init__(self):
        super().__init__()
        self.rates = []

    def on_epoch_end(self, epoch, logs=None):
        self.rates.append(float(tf.keras.backend.get_value(self.model.optimizer.learning_rate)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    hvd.init()
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    # Generated MNIST-shaped data, different on each rank (as each rank reads its own shard).
    rng = np.random.default_rng(hvd.rank())
    labels = rng.integers(0, 10, size=512)
    images = (rng.random((512, 28, 28)) * 64 + labels[:, None, None] * 19).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(images[..., tf.newaxis] / 255.0, tf.float32), tf.cast(labels, tf.int64)))
    dataset = dataset.repeat().shuffle(512, seed=hvd.rank()).batch(32)

    tf.random.set_seed(hvd.rank())  # different initial weights per rank: the broadcast callback must fix it
    model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(8, [3, 3], activation="relu", input_shape=(28, 28, 1)),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])

    # Horovod: scale the learning rate by the number of workers.
    scaled_lr = 0.01 * hvd.size()
    opt = tf.keras.optimizers.SGD(scaled_lr, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt)
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"])

    record = RecordLearningRate()
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Average metrics among workers at the end of every epoch.
        hvd.callbacks.MetricAverageCallback(),
        # Warm the learning rate up from scaled_lr / size to scaled_lr.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=WARMUP_EPOCHS, verbose=1),
        # Then keep it, and from epoch 3 decay it tenfold per epoch (a constant multiplier decays exponentially).
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=scaled_lr, multiplier=1.0,
                                                   start_epoch=WARMUP_EPOCHS, end_epoch=EPOCHS - 2),
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=scaled_lr, multiplier=1e-1, start_epoch=EPOCHS - 2),
        record,
    ]
    if hvd.rank() == 0:
        os.makedirs(args.out, exist_ok=True)
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(os.path.join(args.out, "checkpoint-{epoch}.h5")))

    history = model.fit(dataset, steps_per_epoch=8, callbacks=callbacks, epochs=EPOCHS,
                        verbose=1 if hvd.rank() == 0 else 0)

    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    seen = {"rank": hvd.rank(), "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
            "rates": record.rates, "weights_sum": float(weights.sum()),
            "mean_rank": float(hvd.allreduce(tf.constant(float(hvd.rank()))).numpy())}
    everyone = hvd_tf.allgather_object(seen)
    if hvd.rank() == 0:
        with open(os.path.join(args.out, "callbacks.json"), "w") as f:
            json.dump({"size": hvd.size(), "scaled_lr": scaled_lr, "ranks": everyone,
                       "keras": type(model).__module__}, f)


if __name__ == "__main__":
    main()
