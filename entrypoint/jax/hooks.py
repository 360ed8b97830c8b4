"""The hooks contract on JAX: the context hooks receive, the Keras 3 model built under the distribution, the data.

``build_datasets(args, ctx)`` returns ``(train, eval)``: each a tuple ``(x, y)`` or ``(x, y, sample_weight)`` of
NumPy arrays with one row per example (``x`` may be a list or dict of arrays; ``eval`` may be None), neither
batched nor shuffled: the loop shuffles each epoch by ``--seed`` and the epoch, batches them with the global batch
and gives each process its rows of each batch (docs/jax.md). ``build_model(args, ctx)`` returns a Keras 3 model,
compiled, or one that ``compile_model(model, optimizer, args, ctx)`` compiles (``build_optimizer(args, ctx)``, else
Adam). Under ``model_parallel``, ``build_layout_map(mesh, args, ctx)`` gives the layout of its variables.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import keras
import numpy as np

from entrypoint.errors import ConfigError
from entrypoint.jax.distributed import Devices
from entrypoint.lifecycle.watch.watchdog import reads
from entrypoint.options import DEFAULT_BATCH_SIZE, DEFAULT_EPOCHS
from entrypoint.outputs.staging import Staging
from entrypoint.planning.plan import Plan
from entrypoint.planning.usercode import module_default

READ_ROWS = 32  # rows of an array read at a time (each part read is progress for the hang watchdog)


@dataclass(frozen=True)
class JaxContext:
    """What the hooks receive: this process's place, batch sizes, output dirs and the devices.

    ``rank`` and ``world_size`` count processes (one per node); ``replicas`` the devices a batch is split over.
    """

    rank: int
    world_size: int
    is_chief: bool
    trial: str | None
    replicas: int
    per_replica_batch_size: int
    global_batch_size: int
    epochs: int
    seed: int
    model_dir: str
    checkpoint_dir: str
    tensorboard_dir: str
    devices: Devices = field(repr=False)


def make_context(plan: Plan, module: ModuleType, found: Devices, replicas: int, staging: Staging) -> JaxContext:
    """The context of this process: the global batch is the per-replica batch x the data axis's devices."""
    options, placed = plan.options, plan.placed
    per_replica = int(options.batch_size or module_default(module, "batch_size", DEFAULT_BATCH_SIZE))
    return JaxContext(
        rank=placed.training_rank, world_size=placed.world_size, is_chief=placed.is_chief, trial=plan.topology.trial,
        replicas=replicas, per_replica_batch_size=per_replica, global_batch_size=per_replica * replicas,
        epochs=int(options.epochs or module_default(module, "epochs", DEFAULT_EPOCHS)), seed=options.seed,
        model_dir=str(staging.local("model")), checkpoint_dir=str(staging.local("checkpoints")),
        tensorboard_dir=str(staging.local("tensorboard")), devices=found)


def build_compiled_model(module: ModuleType, args: argparse.Namespace, ctx: JaxContext) -> Any:
    """``build_model`` (then ``build_optimizer`` / ``compile_model`` when defined): a compiled Keras 3 model."""
    model = module.build_model(args, ctx)
    if not isinstance(model, keras.Model):
        raise ConfigError("--module", f"{module.__name__}.build_model must return a Keras 3 model (keras.Model), "
                          f"got {type(model).__name__}")
    compile_model = getattr(module, "compile_model", None)
    if callable(compile_model):
        build_optimizer = getattr(module, "build_optimizer", None)
        optimizer = build_optimizer(args, ctx) if callable(build_optimizer) else keras.optimizers.Adam()
        compile_model(model, optimizer, args, ctx)
    if not model.compiled:
        raise ConfigError("--module", f"{module.__name__}.build_model returned an uncompiled model and the module "
                          "defines no compile_model(model, optimizer, args, ctx)")
    if not model.built:
        raise ConfigError("--module", f"{module.__name__}.build_model returned an unbuilt model: give it an Input "
                          "shape (its weights must exist before a checkpoint can restore them)")
    model.optimizer.build(model.trainable_variables)
    return model


@dataclass(frozen=True)
class Arrays:
    """One split of the data: ``x`` (an array, or a list or dict of arrays), ``y`` and ``sample_weight``."""

    x: Any
    y: Any
    sample_weight: Any = None

    @property
    def size(self) -> int:
        return int(keras.tree.flatten(self.x)[0].shape[0])

    def take(self, rows: Any) -> tuple[Any, Any, Any]:
        """The rows ``rows`` (indices) of every array, read ``READ_ROWS`` at a time (an array read lazily, such as
        ``np.memmap`` or ``np.load(..., mmap_mode="r")`` on a network disk, reads them only now): each part read
        counts as progress for the hang watchdog (``watchdog.reads``), so a slow read that goes on is not a hang."""
        read = reads()

        def pick(a: Any) -> Any:
            if a is None:
                return None
            source = a if isinstance(a, np.ndarray) else np.asarray(a)
            out = np.empty((len(rows), *source.shape[1:]), dtype=source.dtype)
            for start in range(0, len(rows), READ_ROWS):
                part = rows[start:start + READ_ROWS]
                out[start:start + len(part)] = source[part]
                read.value += len(part)
            return out
        return (keras.tree.map_structure(pick, self.x), pick(self.y),
                None if self.sample_weight is None else pick(self.sample_weight))


def _arrays(value: Any, which: str, module: ModuleType) -> Arrays:
    if not isinstance(value, tuple) or len(value) not in (2, 3):
        raise ConfigError("--module", f"{module.__name__}.build_datasets: the {which} split must be a tuple (x, y) or "
                          "(x, y, sample_weight) of NumPy arrays")
    data = Arrays(*value)
    sizes = {int(np.shape(a)[0]) for a in [*keras.tree.flatten(data.x), data.y, data.sample_weight] if a is not None}
    if len(sizes) != 1 or 0 in sizes:
        raise ConfigError("--module", f"{module.__name__}.build_datasets: the {which} split's arrays must have the "
                          f"same number of rows, at least one (found {sorted(sizes)})")
    return data


def user_datasets(module: ModuleType, args: argparse.Namespace, ctx: JaxContext) -> tuple[Arrays, Arrays | None]:
    """Call ``build_datasets`` and check it returned ``(train, eval or None)`` of array tuples."""
    result = module.build_datasets(args, ctx)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ConfigError("--module", f"{module.__name__}.build_datasets must return (train, eval_or_None)")
    train = _arrays(result[0], "training", module)
    return train, None if result[1] is None else _arrays(result[1], "evaluation", module)


class Batches:
    """The training split's global batches, each epoch in the order ``--seed`` and the epoch give (the same on
    every process, and again on a resume), cut to this process's share; the last one trimmed to the devices."""

    def __init__(self, data: Arrays, global_batch: int, share: Any, seed: int, shuffle: bool) -> None:
        self.data, self.global_batch, self.share, self.seed, self.shuffle = data, global_batch, share, seed, shuffle

    @property
    def per_epoch(self) -> int:
        return -(-self.data.size // self.global_batch)

    def epoch(self, epoch: int, start: int = 0) -> Any:
        """(batch index, (x, y, sample_weight)) of this process from batch ``start`` of ``epoch`` on."""
        order = (np.random.default_rng([self.seed, epoch]).permutation(self.data.size) if self.shuffle
                 else np.arange(self.data.size))
        for index in range(start, self.per_epoch):
            rows = order[index * self.global_batch:(index + 1) * self.global_batch]
            yield index, self.data.take(rows[self.share.rows(len(rows), self.global_batch)])
