"""One worker of a MultiWorkerMirrored cluster on 127.0.0.1 that passes points the way the Keras loop does (a
collective between each two) and hears events at random points; prints, as JSON, what it heard and what every
worker acted on where.

``python tests/tensorflow/agreement_probe.py INDEX SEED POINTS PORT,PORT,...``: worker INDEX of as many as ports (0 is
the chief). Reads from the coordination service arrive up to 20 ms late (``SlowNetwork``). Each worker hears a notice
at a point with probability 1/10, after a random pause (so the workers drift apart by up to a point), and the worker
SEED % WORKERS hears a stop at a random point; nothing ends at the stop here: the probe checks the agreement, not what
the loop does with it.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
INDEX, SEED, POINTS = (int(a) for a in sys.argv[1:4])
PORTS = [int(p) for p in sys.argv[4].split(",")]
WORKERS = len(PORTS)
os.environ["TF_CONFIG"] = json.dumps({
    "cluster": {"chief": [f"127.0.0.1:{PORTS[0]}"], "worker": [f"127.0.0.1:{port}" for port in PORTS[1:]]},
    "task": {"type": "chief", "index": 0} if INDEX == 0 else {"type": "worker", "index": INDEX - 1}})

import tensorflow as tf  # noqa: E402

from entrypoint.tensorflow.agreement import NOTICE, STOP, Agreement, coordination_service  # noqa: E402


class SlowNetwork:
    """TensorFlow's coordination service whose answers to reads arrive up to 20 ms late, as over a busy network:
    a worker that acted on what it happened to have read by then would act late, or not at all."""

    def __init__(self, service: Any, rng: random.Random) -> None:
        self.service, self.rng = service, rng

    def get_config_key_value(self, key: str, timeout_ms: int) -> str:
        value = self.service.get_config_key_value(key, timeout_ms)
        time.sleep(self.rng.uniform(0, 0.02))
        return str(value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.service, name)


def main() -> dict[str, object]:
    implementation = tf.distribute.experimental.CommunicationImplementation.RING
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=implementation,
                                                                              timeout_seconds=60))

    @tf.function
    def collective() -> tf.Tensor:
        return strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)

    shared = random.Random(SEED)
    stopper, stop_point = SEED % WORKERS, shared.randint(POINTS // 4, 3 * POINTS // 4)
    rng = random.Random(SEED * 1000 + INDEX)
    network = SlowNetwork(coordination_service(), random.Random(SEED * 7919 + INDEX))
    agreement = Agreement(WORKERS, INDEX, 60.0, network).start()
    heard: list[list[object]] = []
    acted: list[list[object]] = []
    for point in range(1, POINTS + 1):
        time.sleep(rng.uniform(0, 0.01))  # the workers drift: the others wait in the collective, then rush on
        collective()  # the step before each point: no worker gets more than one point ahead of another
        events = []
        if rng.random() < 0.1:
            events.append((NOTICE, f"notice of worker {INDEX} at {point}"))
        if stopper == INDEX and point == stop_point:
            events.append((STOP, f"SIGTERM on worker {INDEX}"))
        heard += [[point, kind] for kind, _ in events]
        acted += [[a.point, a.kind, a.what] for a in agreement.point(events)]
    collective()
    agreement.close()
    return {"heard": heard, "acted": acted, "stop": [stopper, stop_point]}


if __name__ == "__main__":
    print(json.dumps(main()))
