"""The hooks contract: the context hooks receive, the model built in scope, datasets batched and sharded.

``build_datasets(args, ctx)`` returns ``(train, eval)`` tf.data.Datasets of UNBATCHED examples
(``eval`` may be None), neither repeated nor sharded: the entrypoint batches them with the global
batch size and shards them for the strategy (see docs/tensorflow.md).
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.options import DEFAULT_BATCH_SIZE, DEFAULT_EPOCHS
from entrypoint.outputs.staging import Staging
from entrypoint.planning.plan import Plan
from entrypoint.planning.usercode import module_default
from entrypoint.tensorflow.keras3 import check_hooks_model

log = logging.getLogger("entrypoint.tensorflow")


@dataclass(frozen=True)
class TFContext:
    """What the hooks receive: this replica's place, batch sizes, output dirs and the strategy.

    ``rank`` and ``world_size`` count training processes (one per node under TensorFlow), as in PyTorch; an
    evaluator is not one of them (``rank`` None).
    """

    role: str
    index: int
    rank: int | None
    world_size: int
    is_chief: bool
    trial: str | None
    num_replicas_in_sync: int
    per_replica_batch_size: int
    global_batch_size: int
    epochs: int
    seed: int
    model_dir: str
    checkpoint_dir: str
    tensorboard_dir: str
    strategy: Any = field(repr=False)


def make_context(plan: Plan, module: ModuleType, strategy: Any, staging: Staging) -> TFContext:
    """The context for this replica; the global batch is per-replica batch x replicas in sync.

    The output dirs are where TensorFlow writes: local (or the FUSE mount), or for ``gs://`` without the mount
    the process's staging directories, which ``staging`` mirrors to the bucket (entrypoint/outputs/staging.py).
    """
    options = plan.options
    per_replica = int(options.batch_size or module_default(module, "batch_size", DEFAULT_BATCH_SIZE))
    topo, placed = plan.topology, plan.placed
    return TFContext(
        role=topo.role, index=topo.index, rank=placed.rank, world_size=placed.world_size,
        is_chief=placed.is_chief, trial=topo.trial,
        num_replicas_in_sync=strategy.num_replicas_in_sync, per_replica_batch_size=per_replica,
        global_batch_size=per_replica * strategy.num_replicas_in_sync,
        epochs=int(options.epochs or module_default(module, "epochs", DEFAULT_EPOCHS)), seed=options.seed,
        model_dir=str(staging.local("model")), checkpoint_dir=str(staging.local("checkpoints")),
        tensorboard_dir=str(staging.local("tensorboard")), strategy=strategy,
    )


def build_compiled_model(module: ModuleType, args: argparse.Namespace, ctx: TFContext) -> Any:
    """``build_model`` (then ``build_optimizer`` / ``compile_model`` when defined) inside the strategy's scope.

    A Keras 3 model is refused at once, on every replica alike (``keras3.check_hooks_model``)."""
    import tensorflow as tf

    with ctx.strategy.scope():
        model = module.build_model(args, ctx)
        check_hooks_model(model, module.__name__, ctx.strategy, spans=ctx.world_size > 1)
        compile_model = getattr(module, "compile_model", None)
        if callable(compile_model):
            build_optimizer = getattr(module, "build_optimizer", None)
            optimizer = build_optimizer(args, ctx) if callable(build_optimizer) else tf.keras.optimizers.Adam()
            compile_model(model, optimizer, args, ctx)
        elif getattr(model, "optimizer", None) is None:
            raise ConfigError("--module", f"{module.__name__}.build_model returned an uncompiled model and the "
                              "module defines no compile_model(model, optimizer, args, ctx)")
    if not model.built:
        log.warning("build_model returned an unbuilt model: give it an Input shape so restore can find its weights")
    return model


def user_datasets(module: ModuleType, args: argparse.Namespace, ctx: TFContext) -> tuple[Any, Any]:
    """Call ``build_datasets`` and check it returned ``(train, eval or None)``."""
    result = module.build_datasets(args, ctx)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ConfigError("--module", f"{module.__name__}.build_datasets must return (train, eval_or_None)")
    return result[0], result[1]


def batched(dataset: Any, ctx: TFContext, multi_worker: bool) -> Any:
    """Batch with the GLOBAL batch size; under MultiWorkerMirroredStrategy shard by DATA.

    DATA sharding: every worker runs the same pipeline and keeps its own slice of each global
    batch, so any source (in-memory arrays, a file listing) shards correctly, provided the pipeline
    is deterministic across workers (the entrypoint seeds TensorFlow with ``--seed``).
    """
    import tensorflow as tf

    dataset = dataset.batch(ctx.global_batch_size)
    if multi_worker:
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        dataset = dataset.with_options(opts)
    return dataset.prefetch(tf.data.AUTOTUNE)


def parameter_server_input(module: ModuleType, args: argparse.Namespace, ctx: TFContext, which: int) -> Any:
    """A DatasetCreator: each PS worker builds its own repeated pipeline (the whole set; fit needs steps)."""
    import tensorflow as tf

    def dataset_fn(input_context: Any) -> Any:
        dataset = user_datasets(module, args, ctx)[which].repeat()
        per_replica = input_context.get_per_replica_batch_size(ctx.global_batch_size)
        return dataset.batch(per_replica).prefetch(tf.data.AUTOTUNE)

    return tf.keras.utils.experimental.DatasetCreator(dataset_fn)


def steps_per_epoch(dataset: Any, ctx: TFContext, module: ModuleType) -> int | None:
    """Global steps per epoch: ``DEFAULTS["steps_per_epoch"]``, else from the unbatched cardinality."""
    explicit = module_default(module, "steps_per_epoch", None)
    if explicit:
        return int(explicit)
    count = int(dataset.cardinality())
    if count < 0:  # unknown or infinite
        return None
    return max(1, -(-count // ctx.global_batch_size))
