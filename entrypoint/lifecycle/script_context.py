"""The answers behind the small context API for scripts (``entrypoint.context``, its public path, shows its use):
who am I, where do outputs go, report a tuning metric, count a step, stop politely.

Under the entrypoint the answers come from the plan the runner binds before the user's code starts
(``bind``); a process the user's code started itself finds the plan its launcher handed over
(TRAINER_PLAN_FILE), and a script started some other way gets them from the cluster environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from entrypoint.cluster.placement import Placement, place
from entrypoint.cluster.topology import ClusterTopology
from entrypoint.lifecycle import recorder
from entrypoint.lifecycle.signals import StopRequest
from entrypoint.outputs.hypertune import MetricReporter
from entrypoint.outputs.locations import OutputDirs, local_path, resolve_outputs

if TYPE_CHECKING:
    from entrypoint.planning.plan import Plan

_stop = StopRequest()


@dataclass(frozen=True)
class _Answers:
    topology: ClusterTopology
    placement: Placement
    outputs: OutputDirs


_bound: _Answers | None = None


def bind(plan: Plan) -> None:
    """Answer from ``plan``, a process's plan (the runner calls this before the user's code runs)."""
    global _bound
    _bound = _Answers(plan.topology, plan.placed, plan.outputs)


@cache
def _found() -> _Answers:
    """Not bound: a process the user's code started (its launcher's plan), or a script started without us."""
    from entrypoint.cluster.environments import read_settings, resolve
    from entrypoint.planning import handoff

    plan = handoff.load_if_any()
    if plan is not None:
        return _Answers(plan.topology, plan.placed, plan.outputs)
    topo, settings = resolve(), read_settings()
    local_rank = topo.platform_ranks.local_rank if topo.platform_ranks is not None else 0
    outputs = resolve_outputs(job_dir=settings.job_dir, model_dir=settings.model_dir,
                              checkpoint_dir=settings.checkpoint_dir, tensorboard_dir=settings.tensorboard_dir,
                              trial=topo.trial)
    return _Answers(topo, place(topo, 1, local_rank), outputs)


def _answers() -> _Answers:
    return _bound if _bound is not None else _found()


def topology() -> ClusterTopology:
    """This replica's place in the job (node facts)."""
    return _answers().topology


def placement() -> Placement:
    """This process's place: node rank, rank, local rank, world size."""
    return _answers().placement


def is_chief() -> bool:
    """True only in the one process that writes models, checkpoints and tuning metrics."""
    return placement().is_chief


def rank() -> int | None:
    """Global process rank; None on a parameter server or an evaluator (they are not in the collective)."""
    return placement().rank


def world_size() -> int:
    """Number of training processes."""
    return placement().world_size


def local_rank() -> int:
    """Rank on this node (selects the GPU)."""
    return placement().local_rank


def model_dir() -> str:
    """Where the chief exports the model (a local or /gcs path)."""
    return local_path(_answers().outputs.model_dir)


def checkpoint_dir() -> str:
    """Where the chief writes checkpoints."""
    return local_path(_answers().outputs.checkpoint_dir)


def tensorboard_dir() -> str:
    """Where the chief writes TensorBoard logs."""
    return local_path(_answers().outputs.tensorboard_dir)


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


@cache
def _recorder() -> recorder.Recorder:
    answers = _answers()
    return recorder.for_training(answers.outputs.job_dir, answers.topology.replica_name, answers.placement.rank,
                                 is_chief())


def step_done(step: int) -> None:
    """Training step ``step`` (the number of steps trained so far, counting earlier attempts') is done: the job
    ledger counts the script's progress, so ``python -m entrypoint goodput`` can tell productive time from the
    rest (docs/goodput.md). The chief's calls count; elsewhere a no-op. Cheap enough to call every step.

    The first call of an attempt says where it resumed: ``step_done(k)`` first means steps up to ``k - 1`` were
    kept, and any trained after them by an earlier attempt were lost.
    """
    rec = _recorder()
    if not rec.on:
        return
    if rec.last_step < 0:  # this attempt's first report: it resumed after step - 1
        rec.restored(max(int(step) - 1, 0))
        rec.step_begin()
    rec.step_end(int(step))
    rec.step_begin()


def finish(code: int) -> None:
    """The script ended with ``code`` (the runner calls this): the ledger's records are written out."""
    if _recorder.cache_info().currsize:
        _recorder().close("finished" if code == 0 else "failed")
