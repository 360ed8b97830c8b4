"""The small context API for scripts: who am I, where do outputs go, report a tuning metric.

    from entrypoint import context
    if context.is_chief():
        model.save(context.model_dir())
    context.report_metric("accuracy", acc, step)
"""

from __future__ import annotations

from functools import lru_cache

from entrypoint.environments import read_settings, resolve
from entrypoint.hypertune import MetricReporter
from entrypoint.outputs import OutputDirs, local_path, resolve_outputs
from entrypoint.topology import ClusterTopology


@lru_cache(maxsize=1)
def topology() -> ClusterTopology:
    """This process's resolved topology."""
    return resolve()


def is_chief() -> bool:
    """True only in the one process that writes models, checkpoints and tuning metrics."""
    return topology().is_chief


def rank() -> int:
    """Global process rank (node rank where processes are not spawned per GPU)."""
    topo = topology()
    return topo.process.rank if topo.process is not None else (topo.node_rank or 0)


def world_size() -> int:
    """Number of training processes."""
    topo = topology()
    return topo.process.world_size if topo.process is not None else topo.num_nodes


def local_rank() -> int:
    """Rank on this node (selects the GPU)."""
    topo = topology()
    return topo.process.local_rank if topo.process is not None else 0


@lru_cache(maxsize=1)
def outputs() -> OutputDirs:
    """Output directories (the entrypoint hands resolved ones to its children through AIP_*)."""
    settings = read_settings()
    return resolve_outputs(job_dir=settings.job_dir, model_dir=settings.model_dir,
                           checkpoint_dir=settings.checkpoint_dir, tensorboard_dir=settings.tensorboard_dir,
                           trial=topology().trial)


def model_dir() -> str:
    """Where the chief exports the model (a local or /gcs path)."""
    return local_path(outputs().model_dir)


def checkpoint_dir() -> str:
    """Where the chief writes checkpoints."""
    return local_path(outputs().checkpoint_dir)


def tensorboard_dir() -> str:
    """Where the chief writes TensorBoard logs."""
    return local_path(outputs().tensorboard_dir)


@lru_cache(maxsize=1)
def _reporter() -> MetricReporter:
    return MetricReporter(is_chief(), topology().trial)


def report_metric(name: str, value: float, step: int = 0) -> None:
    """Report a hyperparameter-tuning metric (written by the chief only; no-op elsewhere)."""
    _reporter().report(name, value, step)
