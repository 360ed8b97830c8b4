"""An unmodified horovod.tensorflow.keras script, as in Horovod's own Keras examples."""

import argparse
import hashlib
import json
import os

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    hvd.init()
    tf.random.set_seed(hvd.rank())  # different initial weights per rank: the callback must broadcast
    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", input_shape=(8,)),
                                 tf.keras.layers.Dense(1)])
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=0.02 * hvd.size()))
    model.compile(loss="mse", optimizer=optimizer)
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(512, 8)).astype("float32")
    y = x @ (np.arange(8, dtype="float32") / 8)[:, None]
    history = model.fit(x, y, batch_size=32, epochs=4, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
    digests = hvd_tf.allgather_object(digest)
    if hvd.rank() == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "keras.json"), "w") as f:
            json.dump({"size": hvd.size(), "digests": digests, "losses": history.history["loss"],
                       "legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS"),
                       "keras": type(model).__module__}, f)


if __name__ == "__main__":
    main()
