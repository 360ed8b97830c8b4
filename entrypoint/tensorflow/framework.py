"""TensorFlow as the registry sees it: tf.distribute strategies, one process per node.

Imports nothing heavy: TF_CONFIG, TF_USE_LEGACY_KERAS and TF_CPP_MIN_LOG_LEVEL must be in the
environment before the first ``import tensorflow``.
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.topology import ClusterTopology
from entrypoint.errors import ConfigError
from entrypoint.options import RunOptions
from entrypoint.outputs.locations import OutputDirs
from entrypoint.planning.registry import Framework, NodePlan, ServerPool

STRATEGIES = ("default", "OneDeviceStrategy", "MirroredStrategy", "MultiWorkerMirroredStrategy",
              "ParameterServerStrategy")
SINGLE_NODE = ("default", "OneDeviceStrategy", "MirroredStrategy")
# TensorFlow's C++ INFO lines ("Ignoring error status when releasing multi-device function handle", ...)
# drown the job's own lines: hide INFO unless the user chose a level.
QUIET_CPP_LOGS = "1"
# The CUDA major version of images/tensorflow's GPU image: tensorflow[and-cuda] 2.21's nvidia-*-cu12 wheels.
CUDA_MAJOR = 12


def choose_strategy(topo: ClusterTopology, forced: str | None, gpus: int) -> tuple[str, str]:
    """The strategy and why: forced by --strategy (checked), else from the cluster's shape."""
    if forced is not None:
        if forced == "ParameterServerStrategy" and not topo.servers:
            raise ConfigError("--strategy", "ParameterServerStrategy needs a ps pool (Vertex workerpool2)")
        if forced in SINGLE_NODE and topo.num_nodes > 1:
            raise ConfigError("--strategy", f"{forced} is single-node but there are {topo.num_nodes} training nodes")
        return forced, "forced by --strategy"
    if topo.servers:
        return "ParameterServerStrategy", f"a parameter-server pool of {len(topo.servers)} is present"
    if topo.num_nodes > 1:
        return "MultiWorkerMirroredStrategy", f"{topo.num_nodes} training nodes"
    if gpus > 1:
        return "MirroredStrategy", f"one node with {gpus} GPUs"
    return "default", "one node with at most one GPU"


def plan(topo: ClusterTopology, options: RunOptions, user_set: Mapping[str, str], gpus: int,
         outputs: OutputDirs) -> NodePlan:
    """One process per node; workerpool2 is parameter servers only under ParameterServerStrategy."""
    strategy, reason = choose_strategy(topo, options.strategy, gpus)
    if strategy == "ParameterServerStrategy" and topo.num_nodes < 2:  # TensorFlow: "There must be at least one worker"
        raise ConfigError(ev.TF_CONFIG if topo.source == "tf_config" else ev.CLUSTER_SPEC, "ParameterServerStrategy "
                          "needs at least one worker besides the chief (the chief dispatches its steps to workers)",
                          "cluster")
    if options.nproc_per_node not in (None, 1):
        raise ConfigError("--nproc-per-node", "TensorFlow runs one process per node (it drives every GPU itself)")
    if options.on_nonfinite == "skip":
        raise ConfigError("--on-nonfinite", "skip needs the PyTorch or Horovod hooks loop: Keras applies every "
                          "step's update; use fail (the default)")
    server_pool: ServerPool | None = None
    if topo.servers:
        server_pool = "parameter_servers" if strategy == "ParameterServerStrategy" else "reduction_server"
    if topo.role == "ps" and server_pool == "reduction_server":
        raise ConfigError(ev.CLUSTER_SPEC, f"this replica is in the server pool, which is a Reduction Server with "
                          f"{strategy}: run Google's reductionserver image in workerpool2, not this one", "task.type")
    env = {
        # tf-keras (Keras 2) ships with TensorFlow in our images: Keras 3's fit fails under
        # MultiWorkerMirroredStrategy (keras-team/keras#20585, tensorflow/tensorflow#72388; refused across
        # workers by keras3.py). The user's own values win.
        ev.TF_USE_LEGACY_KERAS: user_set.get(ev.TF_USE_LEGACY_KERAS, "1"),
        ev.TF_CPP_MIN_LOG_LEVEL: user_set.get(ev.TF_CPP_MIN_LOG_LEVEL, QUIET_CPP_LOGS),
    }
    return NodePlan(strategy=strategy, reason=reason, nproc_per_node=1, server_pool=server_pool, env=env,
                    peers_serve=server_pool == "parameter_servers")


FRAMEWORK = Framework(
    name="tensorflow",
    probe="tensorflow",
    strategies=STRATEGIES,
    plan=plan,
    launcher="entrypoint.tensorflow.launch:launch",
    worker="entrypoint.tensorflow.launch:run",
    user_variables=(ev.TF_USE_LEGACY_KERAS, ev.TF_CPP_MIN_LOG_LEVEL),
    title="TensorFlow",
    roles=("chief", "worker", "ps", "evaluator"),  # ParameterServerStrategy's servers; the sidecar evaluator
    gpus_per_process="all",  # one process per node drives every GPU
    image="tensorflow",
    cuda_major=CUDA_MAJOR,
    kubeflow_kinds=("tfjob",),
    # a worker or server gone, a collective that timed out (tf.errors' types, whatever module defines them)
    peer_errors=("tensorflow.errors.DeadlineExceededError", "tensorflow.errors.UnavailableError",
                 "tensorflow.errors.AbortedError"),
    # where its collectives, its coordinator and its eager remote calls run (their own types too: a coordinator's
    # ClosureInputError over a refused connection is a lost peer, one over the user's dataset error is not)
    peer_modules=("tensorflow.python.distribute", "tensorflow.python.eager", "tensorflow.python.framework.errors_impl"),
)
