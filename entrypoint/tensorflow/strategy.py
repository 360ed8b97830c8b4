"""Build the tf.distribute strategy the plan chose (one factory, a clear error for unknown names)."""

from __future__ import annotations

import logging
from typing import Any

from entrypoint import errors, failures
from entrypoint.errors import ConfigError
from entrypoint.lifecycle.watch import watchdog
from entrypoint.planning.plan import Plan
from entrypoint.tensorflow.framework import STRATEGIES

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


def make_strategy(plan: Plan, failure_context: failures.FailureContext) -> Any:
    """The strategy named by ``plan.strategy``, logged with the plan's reason."""
    import tensorflow as tf

    name, gpus, options = plan.strategy, plan.gpus_per_node, plan.options
    if name == "default":
        strategy = tf.distribute.get_strategy()
    elif name == "OneDeviceStrategy":
        strategy = tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
    elif name == "MirroredStrategy":
        strategy = tf.distribute.MirroredStrategy()  # NCCL all-reduce across this node's GPUs
    elif name == "MultiWorkerMirroredStrategy":
        with start_deadline(failure_context, options.timeout, f"joining the other workers ({peers(plan)})"):
            strategy = tf.distribute.MultiWorkerMirroredStrategy(
                communication_options=communication_options(gpus, options.timeout))
    elif name == "ParameterServerStrategy":
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=PS_MIN_SHARD_BYTES, max_shards=max(len(plan.topology.servers), 1))
        with start_deadline(failure_context, options.timeout,
                            f"connecting to the workers and parameter servers ({peers(plan)})"):
            strategy = tf.distribute.ParameterServerStrategy(cluster_resolver(), variable_partitioner=partitioner)
    else:
        raise ConfigError("--strategy", f"{name} is not a TensorFlow strategy; expected one of {', '.join(STRATEGIES)}")
    log.info("strategy %s with %d replica(s) in sync (%s)", name, strategy.num_replicas_in_sync, plan.reason)
    return strategy


def peers(plan: Plan) -> str:
    """The cluster members this replica waits for, by pool and address (for the log line before waiting)."""
    peers = plan.topology.training_peers(include_servers=plan.strategy == "ParameterServerStrategy")
    return ", ".join(str(p) for p in peers)


def start_deadline(failure_context: failures.FailureContext, seconds: float, what: str) -> Any:
    """A backstop for TensorFlow's cluster start (the peers already met at the start-up barrier)."""
    log.info("%s; if one is lost meanwhile this replica ends after --timeout %.0f s with exit code 142", what, seconds)
    failure = failures.Failure(errors.START_DEADLINE, f"TensorFlow's cluster start outlived --timeout {seconds:g} s "
                                                      f"while {what}")
    return watchdog.start_deadline(seconds, failure_context, failure)


def is_multi_worker(strategy: Any) -> bool:
    """True for MultiWorkerMirroredStrategy (every worker must take part in saves and gathers)."""
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def is_parameter_server(strategy: Any) -> bool:
    """True for ParameterServerStrategy (the chief coordinates; workers and ps only serve)."""
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.ParameterServerStrategy)
