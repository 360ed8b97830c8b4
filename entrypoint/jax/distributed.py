"""One ``jax.distributed.initialize`` per process, then the device mesh and Keras' distribution over it.

The coordinator is the chief's cluster address (its port is free again once the start-up barrier closed it), the
process count and id the placement's, from whichever format the job came in (Vertex's CLUSTER_SPEC, TF_CONFIG,
PET_*, RANK/WORLD_SIZE, Kubeflow Trainer's JAX_*). On CPU the processes' collectives are Gloo's. Every process then
asks for the devices at once: JAX starts its backend lazily and collectively, so a process that never asked would
leave the others waiting for its topology.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.jax.framework import parse_mesh
from entrypoint.outputs import storage
from entrypoint.outputs.locations import local_path
from entrypoint.planning.plan import Plan

log = logging.getLogger("entrypoint.jax")
COMPILE_CACHE = "compile_cache"  # under the job dir (PyTorch's --compile keeps its archive there too)
MIN_COMPILE_SECONDS = 0.2
BATCH, MODEL = "batch", "model"  # the mesh's axis names (Keras' DataParallel calls its one axis "batch")


@dataclass(frozen=True)
class Devices:
    """What this process sees once JAX's distributed runtime is up."""

    process_index: int
    process_count: int
    devices: tuple[Any, ...]  # every device of the job, in JAX's order
    local: tuple[Any, ...]  # this process's
    platform: str  # cpu | gpu

    @property
    def nodes(self) -> int:
        return self.process_count


def start(plan: Plan, own_stops: bool = False) -> Devices:
    """Join the job's other processes (no-op alone) and return the devices; bounded by ``--timeout``. ``own_stops``
    (the hooks loop, which answers SIGTERM itself in every phase): JAX's preemption service, whose notifier would take
    SIGTERM from the start on, is not started (a script keeps it: Orbax's preemption checkpoints use it)."""
    import jax

    placed, gpus = plan.placed, plan.gpus_per_node
    # Orbax's and JAX's INFO lines (each save's dozen, the TPU probe) drown the job's own: warnings only.
    logging.getLogger("absl").setLevel(max(logging.WARNING, logging.getLogger("absl").level))
    if not gpus:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    keep_compiled(jax, plan.outputs.job_dir)
    if own_stops:
        jax.config.update("jax_enable_preemption_service", False)
    world = placed.world_size
    if world > 1:
        address = plan.topology.chief_host_port()
        if address is None:
            raise ConfigError("cluster", f"{world} processes but no chief address for jax.distributed's coordinator")
        rank = placed.training_rank
        log.info("jax.distributed: process %d of %d, coordinator %s:%d (giving up after --timeout %g s)", rank,
                 world, address[0], address[1], plan.options.timeout)
        jax.distributed.initialize(coordinator_address=f"{address[0]}:{address[1]}", num_processes=world,
                                   process_id=rank, initialization_timeout=max(1, math.ceil(plan.options.timeout)))
    devices = Devices(jax.process_index(), jax.process_count(), tuple(jax.devices()), tuple(jax.local_devices()),
                      jax.default_backend())
    log.info("jax %s: %d device(s) in %d process(es), %d here (%s)", jax.__version__, len(devices.devices),
             devices.process_count, len(devices.local), devices.platform)
    return devices


def keep_compiled(jax: Any, job_dir: str) -> str | None:
    """JAX's persistent compilation cache in ``<job dir>/compile_cache/jax``, so a restarted process (a new
    container, a fresh disk) loads what an earlier attempt compiled instead of compiling it again: JAX keys each
    entry by the computation, the devices and its own version, and its first process alone writes an entry (the
    others read it). A cache the user set (``JAX_COMPILATION_CACHE_DIR``) is kept; a job dir that is a URL without a
    mount here gets none (JAX writes the cache as files). Compilations under 0.2 s are not kept (every small op's)."""
    if jax.config.jax_compilation_cache_dir:
        return None
    where = local_path(job_dir)
    if storage.is_remote(where):
        log.info("compile cache: not kept (the job dir %s is not a file system here)", job_dir)
        return None
    folder = os.path.join(where, COMPILE_CACHE, "jax")
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder


def mesh_shape(plan: Plan, found: Devices) -> tuple[int, int]:
    """(data, model): --mesh, else every device on the data axis (data_parallel) or the nodes x each node's
    devices (model_parallel: the model within a node)."""
    total = len(found.devices)
    mesh = parse_mesh(plan.options.framework_option("mesh"))
    if mesh is None:
        mesh = (found.nodes, total // found.nodes) if plan.strategy == "model_parallel" else (total, 1)
    if mesh[0] * mesh[1] != total:
        raise ConfigError("--mesh", f"{mesh[0]}x{mesh[1]} is {mesh[0] * mesh[1]} devices; the job has {total}")
    return mesh


def device_grid(shape: tuple[int, int], found: Devices) -> Any:
    """The devices as a (data, model) grid: a hybrid mesh across nodes (each node's devices together, the data axis
    across nodes, as JAX asks for multi-node GPU jobs), a plain grid on one node."""
    import numpy as np
    from jax.experimental import mesh_utils

    local = len(found.local)
    data, model = shape
    if found.nodes > 1 and local > 0 and model <= local and local % model == 0 and data % found.nodes == 0:
        per_node = (data // found.nodes, model)
        if per_node[0] * per_node[1] == local:
            return mesh_utils.create_hybrid_device_mesh(per_node, (found.nodes, 1), list(found.devices),
                                                        process_is_granule=True)
    ordered = sorted(found.devices, key=lambda d: (d.process_index, d.id))
    return np.array(ordered, dtype=object).reshape(shape)


def set_distribution(plan: Plan, found: Devices, layout_map: Any = None) -> Any:
    """Keras' distribution for the plan's strategy (None for one device): DataParallel over a 1-D mesh, or
    ModelParallel over the (batch, model) mesh with the user's layout map (an empty one: variables replicated).
    Inputs are never auto-sharded by Keras (that needs tf.data): each process feeds its share (``data.py``)."""
    if plan.strategy == "default" or len(found.devices) == 1:
        return None
    import keras

    shape = mesh_shape(plan, found)
    grid = device_grid(shape, found)
    if plan.strategy == "data_parallel":
        mesh = keras.distribution.DeviceMesh((shape[0],), [BATCH], devices=list(grid.reshape(-1)))
        distribution: Any = keras.distribution.DataParallel(device_mesh=mesh, auto_shard_dataset=False)
    else:
        mesh = keras.distribution.DeviceMesh(shape, [BATCH, MODEL], devices=grid)
        layouts = layout_map(mesh) if callable(layout_map) else keras.distribution.LayoutMap(mesh)
        distribution = keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name=BATCH,
                                                        auto_shard_dataset=False)
    keras.distribution.set_distribution(distribution)
    log.info("keras.distribution: %s over a %s mesh (%s)", type(distribution).__name__,
             "x".join(str(n) for n in shape), plan.reason)
    return distribution
