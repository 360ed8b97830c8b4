"""A multi-worker script in the style of TensorFlow's multi-worker tutorial: a short fit, after which the chief
keeps working (its own export, an upload) LATE seconds longer than the workers, who are done at once.

    python -m entrypoint run --framework tensorflow --script tests/tensorflow/late_chief_task.py -- OUT LATE
"""

import json
import os
import sys
import time

import tensorflow as tf

out, late = sys.argv[1], float(sys.argv[2])
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
data = tf.data.Dataset.from_tensor_slices((tf.ones((64, 4)), tf.ones((64, 1)))).batch(16)
model.fit(data, epochs=1, verbose=0)
task = json.loads(os.environ["TF_CONFIG"])["task"]
if task["type"] == "chief":
    time.sleep(late)
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"{task['type']}-{task['index']}.json"), "w") as f:
    json.dump({"time": time.time()}, f)
