"""Build the tf.distribute strategy the plan chose (one factory, a clear error for unknown names)."""

from __future__ import annotations

import logging
import math
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.options import RunOptions
from entrypoint.plan import Plan

log = logging.getLogger("entrypoint.tensorflow")
# Shard variables into pieces of at least this size across the parameter servers.
PS_MIN_SHARD_BYTES = 256 << 10


def communication_options(gpus: int, timeout: float) -> Any:
    """NCCL all-reduce between GPUs, RING (gRPC) on CPU; collectives give up after ``timeout`` seconds."""
    import tensorflow as tf

    impl = tf.distribute.experimental.CommunicationImplementation
    return tf.distribute.experimental.CommunicationOptions(
        implementation=impl.NCCL if gpus else impl.RING, timeout_seconds=timeout)


def cluster_resolver() -> Any:
    """TensorFlow's view of the TF_CONFIG the launcher exported (``chief``, never ``master``)."""
    import tensorflow as tf

    return tf.distribute.cluster_resolver.TFConfigClusterResolver()


def make_strategy(plan: Plan, options: RunOptions) -> Any:
    """The strategy named by ``plan.strategy``, logged with the plan's reason."""
    import tensorflow as tf

    name, gpus = plan.strategy, plan.gpus_per_node
    if name == "default":
        strategy = tf.distribute.get_strategy()
    elif name == "OneDeviceStrategy":
        strategy = tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
    elif name == "MirroredStrategy":
        strategy = tf.distribute.MirroredStrategy()  # NCCL all-reduce across this node's GPUs
    elif name == "MultiWorkerMirroredStrategy":
        with deadline(options.timeout, f"joining the other workers ({peers(plan)})"):
            strategy = tf.distribute.MultiWorkerMirroredStrategy(
                communication_options=communication_options(gpus, options.timeout))
    elif name == "ParameterServerStrategy":
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=PS_MIN_SHARD_BYTES, max_shards=max(len(plan.topology.servers), 1))
        with deadline(options.timeout, f"connecting to the workers and parameter servers ({peers(plan)})"):
            strategy = tf.distribute.ParameterServerStrategy(cluster_resolver(), variable_partitioner=partitioner)
    else:
        accepted = "default, OneDeviceStrategy, MirroredStrategy, MultiWorkerMirroredStrategy, ParameterServerStrategy"
        raise ConfigError("--strategy", f"{name} is not a TensorFlow strategy; expected one of {accepted}")
    if name in ("MultiWorkerMirroredStrategy", "ParameterServerStrategy"):
        default_sigterm()
    log.info("strategy %s with %d replica(s) in sync (%s)", name, strategy.num_replicas_in_sync, plan.reason)
    return strategy


def peers(plan: Plan) -> str:
    """The cluster members this replica waits for, by pool and address (for the log line before waiting)."""
    topo = plan.topology
    pools = {"chief": topo.chief, "worker": topo.workers}
    if plan.strategy == "ParameterServerStrategy":
        pools["ps"] = topo.servers
    return ", ".join(f"{pool}[{i}] {addr}" for pool, members in pools.items() for i, addr in enumerate(members))


@contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """End the process by SIGALRM (exit 142, retryable) when the block outlasts ``seconds``.

    TensorFlow's cluster start waits for every peer with no deadline of its own, holding the GIL
    and swallowing SIGTERM, so neither a Python timer nor a handler could stop it; the kernel's
    default action for SIGALRM can.
    """
    log.info("%s; if one never comes this replica ends after --timeout %.0f s with exit code 142", what, seconds)
    previous = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(max(1, math.ceil(seconds)))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def default_sigterm() -> None:
    """Give SIGTERM back its default action once TensorFlow's cluster runtime has started.

    TensorFlow's coordination service installs a SIGTERM handler that only records a preemption
    notice, so a preempted replica would train on until SIGKILL; dying at once (exit 143,
    retryable) lets the restart resume from the BackupAndRestore state instead.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def is_multi_worker(strategy: Any) -> bool:
    """True for MultiWorkerMirroredStrategy (every worker must take part in saves and gathers)."""
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def is_parameter_server(strategy: Any) -> bool:
    """True for ParameterServerStrategy (the chief coordinates; workers and ps only serve)."""
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.ParameterServerStrategy)
