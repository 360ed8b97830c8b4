"""The small context API for scripts: who am I, where do outputs go, report a tuning metric, stop politely.

    from entrypoint import context
    if context.is_chief():
        model.save(context.model_dir())
    context.report_metric("accuracy", acc, step)
    if context.preempted():          # SIGTERM arrived: save, then leave
        save_checkpoint(); sys.exit(143)

Under the entrypoint the answers come from the plan it handed this process; a script started some
other way gets them from the cluster environment directly.
"""

from __future__ import annotations

from functools import cache

from entrypoint.hypertune import MetricReporter
from entrypoint.outputs import OutputDirs, local_path, resolve_outputs
from entrypoint.signals import StopRequest
from entrypoint.topology import ClusterTopology

_stop = StopRequest()


@cache
def _placed() -> tuple[ClusterTopology, OutputDirs]:
    from entrypoint.environments import read_settings, resolve
    from entrypoint.runner import current_plan

    plan = current_plan()
    if plan is not None:
        return plan.topology, plan.outputs
    topo, settings = resolve(), read_settings()  # not started by the entrypoint
    return topo, resolve_outputs(job_dir=settings.job_dir, model_dir=settings.model_dir,
                                 checkpoint_dir=settings.checkpoint_dir, tensorboard_dir=settings.tensorboard_dir,
                                 trial=topo.trial)


def topology() -> ClusterTopology:
    """This process's place in the job."""
    return _placed()[0]


def is_chief() -> bool:
    """True only in the one process that writes models, checkpoints and tuning metrics."""
    return topology().is_chief


def rank() -> int:
    """Global process rank."""
    return topology().rank


def world_size() -> int:
    """Number of training processes."""
    return topology().world_size


def local_rank() -> int:
    """Rank on this node (selects the GPU)."""
    return topology().local_rank


def model_dir() -> str:
    """Where the chief exports the model (a local or /gcs path)."""
    return local_path(_placed()[1].model_dir)


def checkpoint_dir() -> str:
    """Where the chief writes checkpoints."""
    return local_path(_placed()[1].checkpoint_dir)


def tensorboard_dir() -> str:
    """Where the chief writes TensorBoard logs."""
    return local_path(_placed()[1].tensorboard_dir)


@cache
def _reporter() -> MetricReporter:
    return MetricReporter(is_chief(), topology().trial)


def report_metric(name: str, value: float, step: int = 0) -> None:
    """Report a hyperparameter-tuning metric (written by the chief only; no-op elsewhere)."""
    _reporter().report(name, value, step)


def preempted() -> bool:
    """Whether SIGTERM (or SIGINT) asked this process to stop; poll it once per step.

    The first call takes over SIGTERM and SIGINT (main thread): from then on they only set this
    flag, so the script can save and exit (143 tells the platform to retry). The entrypoint gives
    a stopping process ``--grace-period`` seconds before SIGKILL.
    """
    _stop.install()
    return _stop.requested
