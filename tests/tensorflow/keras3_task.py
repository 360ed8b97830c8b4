"""A Keras 3 script in the style of the Keras and TensorFlow multi-worker guides: ``import keras``, a strategy, a
Sequential model built and compiled in ``strategy.scope()``, ``model.fit`` on a tf.data dataset.

``--keras keras3`` (the default) trains a Keras 3 model; ``--keras tf_keras`` the fix, ``import tf_keras as keras``,
while Keras 3 is imported too (as a script using its utilities would). ``--strategy``: ``multiworker``
(MultiWorkerMirroredStrategy; one worker without a cluster), ``mirrored`` (one node), or ``ps``
(ParameterServerStrategy: the worker and ps replicas serve, the chief fits). Each replica that trained writes
``<output-dir>/result-<task>.json``: its epoch losses and the sum of its weights.
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--keras", choices=["keras3", "tf_keras"], default="keras3")
parser.add_argument("--strategy", choices=["multiworker", "mirrored", "ps"], default="multiworker")
parser.add_argument("--output-dir", required=True)
args = parser.parse_args()

import keras  # noqa: E402  (Keras 3, whatever TF_USE_LEGACY_KERAS says)

if args.keras == "tf_keras":
    import tf_keras as keras

tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
task = tf_config.get("task", {"type": "chief", "index": 0})
if args.strategy == "ps":
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                      task_index=resolver.task_id, protocol=resolver.rpc_layer or "grpc", start=True)
        server.join()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
elif args.strategy == "mirrored":
    strategy = tf.distribute.MirroredStrategy()
else:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

rng = np.random.default_rng(0)
x = rng.standard_normal((256, 8)).astype("float32")
y = x @ rng.standard_normal((8, 1)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()

with strategy.scope():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")

if args.strategy == "ps" and args.keras == "tf_keras":  # tf-keras' way of feeding the workers
    history = model.fit(keras.utils.experimental.DatasetCreator(lambda _: dataset), epochs=2, steps_per_epoch=4,
                        verbose=0)
else:
    history = model.fit(dataset, epochs=2, steps_per_epoch=4, verbose=0)
weights = float(sum(np.sum(np.asarray(w)) for w in model.get_weights()))
result = {"keras": keras.__name__, "version": keras.__version__, "losses": history.history["loss"], "weights": weights,
          "replicas_in_sync": strategy.num_replicas_in_sync}
os.makedirs(args.output_dir, exist_ok=True)
with open(os.path.join(args.output_dir, f"result-{task['type']}-{task['index']}.json"), "w") as f:
    json.dump(result, f)
