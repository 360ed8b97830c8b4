"""JAX (with Keras 3 on it) as the registry sees it: one process per node driving the node's devices, one
``jax.distributed.initialize`` from whatever cluster format the job came in, Keras' distribution set before the
user's code runs.

Imports nothing heavy: ``describe`` plans a JAX job without importing JAX or Keras.
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.topology import ClusterTopology
from entrypoint.errors import ConfigError
from entrypoint.options import RunOptions
from entrypoint.outputs.locations import OutputDirs
from entrypoint.planning.registry import Flag, Framework, NodePlan

# The CUDA major version of images/jax's GPU image: jax[cuda13]'s plugin, the PyTorch image's CUDA.
CUDA_MAJOR = 13
KERAS_BACKEND = "jax"
STRATEGIES = ("default", "data_parallel", "model_parallel")
FLAGS = (
    Flag("--mesh", "the device mesh as DATAxMODEL (e.g. 2x4: 2-way data parallel, 4-way model parallel; the model "
         "axis within a node); default: every device on the data axis, or the nodes x each node's devices under "
         "model_parallel"),
)


def parse_mesh(text: str | None) -> tuple[int, int] | None:
    """``--mesh 2x4`` -> (2, 4); None when not given. A ConfigError for anything else."""
    if text is None:
        return None
    data, sep, model = text.lower().partition("x")
    if not sep or not (data.isdigit() and model.isdigit()) or int(data) < 1 or int(model) < 1:
        raise ConfigError("--mesh", "must be DATAxMODEL with two positive counts, e.g. 2x4")
    return int(data), int(model)


def choose(topo: ClusterTopology, options: RunOptions, gpus: int) -> tuple[str, str]:
    """The strategy and why: --strategy, a model axis in --mesh, else data parallel across every device."""
    mesh = parse_mesh(options.framework_option("mesh"))
    devices = topo.num_nodes * max(gpus, 1)
    if options.strategy is not None:
        if options.strategy == "data_parallel" and mesh is not None and mesh[1] > 1:
            raise ConfigError("--mesh", f"{options.framework_option('mesh')} has a model axis: that is model_parallel")
        return options.strategy, "forced by --strategy"
    if mesh is not None and mesh[1] > 1:
        return "model_parallel", f"--mesh {mesh[0]}x{mesh[1]}: the model sharded {mesh[1]} ways"
    if devices > 1:
        where = f"{topo.num_nodes} node(s)" + (f" x {gpus} GPUs" if gpus else "")
        return "data_parallel", f"Keras' DataParallel over {devices} devices ({where})"
    return "default", "one process with one device"


def plan(topo: ClusterTopology, options: RunOptions, user_set: Mapping[str, str], gpus: int,
         outputs: OutputDirs) -> NodePlan:
    """One process per node (it drives every device of the node); Keras 3 on JAX."""
    if topo.processes_started_externally:
        raise ConfigError(topo.source, "JAX runs one process per node, started by the entrypoint: this process was "
                          "started by a per-process launcher (torchrun, mpirun); run the image's entrypoint once per "
                          "node instead")
    if options.nproc_per_node not in (None, 1):
        raise ConfigError("--nproc-per-node", "JAX runs one process per node (it drives every local device itself)")
    if options.on_nonfinite == "skip":
        raise ConfigError("--on-nonfinite", "skip needs the PyTorch or Horovod hooks loop: Keras applies every "
                          "step's update; use fail (the default)")
    backend = user_set.get(ev.KERAS_BACKEND, KERAS_BACKEND)
    if backend != KERAS_BACKEND:
        raise ConfigError(ev.KERAS_BACKEND, f"is {backend!r}: this framework runs Keras 3 on JAX (unset it, or set "
                          f"it to {KERAS_BACKEND!r})")
    strategy, reason = choose(topo, options, gpus)
    env = {ev.KERAS_BACKEND: KERAS_BACKEND}
    return NodePlan(strategy=strategy, reason=reason, nproc_per_node=1, server_pool="unused" if topo.servers else None,
                    env=env)


FRAMEWORK = Framework(
    name="jax",
    probe="jax",
    strategies=STRATEGIES,
    plan=plan,
    launcher="entrypoint.jax.launch:launch",
    worker="entrypoint.jax.launch:run",
    flags=FLAGS,
    user_variables=(ev.KERAS_BACKEND,),
    title="JAX",
    gpus_per_process="all",  # one process per node drives every local GPU (JAX's one process per host)
    cpu_collectives="gloo",  # jax_cpu_collectives_implementation, set by the worker
    image="jax",
    cuda_major=CUDA_MAJOR,
    kubeflow_kinds=("trainjob",),  # Kubeflow Trainer's JAX runtime (jax-distributed), else the torch runtime's
    # a peer gone shows as XLA's runtime error from a collective or the coordination service (its heartbeat, its
    # barriers), raised from jax's own modules
    peer_errors=("jax.errors.JaxRuntimeError",),  # XLA's runtime error: jaxlib defines it, jax.errors names it
    peer_modules=("jax._src.distributed", "jax._src.interpreters.pxla", "jax._src.dispatch",
                  "jax.experimental.multihost_utils", "entrypoint.jax"),
    peer_messages=("coordination service", "heartbeat", "barrier timed out"),
)
