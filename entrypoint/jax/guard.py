"""The JAX hooks loop's guard, from before ``jax.distributed.initialize`` to the last line: stop signals in every phase,
the hang watchdog and the stop's deadline, the platform's advance notice, the per-step agreement and the job ledger.

Every step is one computation across the job's processes, so every process must take the same decision at the same
point: after each step (and between two evaluation batches) each says what it heard, in one small all-gather
(``vote``: the signal it got, a reclaim notice, a maintenance notice); what any heard, all act on there. Around that:

- **Regions a stop ends at once** (``signals.StopRequest``), where nothing is trained that is not committed: the
  start-up (joining the processes, loading the hooks, building, the restore, and the first step, JAX's trace and
  compile included: nothing of this attempt is trained until it returns) and the export (after the final checkpoint).
  The record and the last line say that nothing was trained to commit, or that the final step is committed.
- **A wait for a batch** (a slow read of the arrays) holds a stop at most ``patience`` seconds: the read is
  interrupted, and the vote that follows it (every process meets there: none can be inside the next step before
  it) stops every process at the step they all trained.
- **The stop's deadline.** From the signal on, each process ends within its ``--grace-period`` (less a margin for
  its record: ``watchdog.record_margin``) whatever holds it (a step or an evaluation batch longer than that, a save,
  a collective a peer left), its record saying what is committed (``holding``): ``preempted_uncommitted`` when a
  trained step is not. Its exit is bounded too: JAX's own end waits for every process at a barrier (300 s), which
  a process that stops alone would wait out past the platform's kill.
- **Live is not hung**: each evaluation batch beats the watchdog, and so does each part of a batch read (``reads``).
- **Peers**: a process that stops at once says so in JAX's coordination service, so a peer that its leaving breaks
  stops with it (``stopped with ...``) instead of calling it lost.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from entrypoint import failures
from entrypoint.cluster.environments.settings import metadata_host
from entrypoint.errors import Interrupted, StopRequested
from entrypoint.lifecycle import recorder, shutdown
from entrypoint.lifecycle.signals import StopRequest
from entrypoint.lifecycle.watch import notice
from entrypoint.lifecycle.watch.notice import NoticeWatcher
from entrypoint.lifecycle.watch.watchdog import HangWatchdog, reads, record_margin
from entrypoint.outputs.checkpoints import checkpoint_path
from entrypoint.outputs.storage import Location
from entrypoint.planning.plan import Plan

log = logging.getLogger("entrypoint.jax")
START_UP = "the start-up"  # a region: from the guard's start to the end of the attempt's first step
WAITING = "waiting for the next batch"  # a region with patience: the read of a batch's rows
EXPORT = "the export"  # a region: after the final checkpoint
STOPPED_KEY = "entrypoint/stopped"  # in JAX's coordination service: who stopped at once, on which signal


def patience(grace: float) -> float:
    """How long a batch read may hold a stop: one that ends in a moment leaves it to the vote after the read."""
    return min(1.0, grace / 10)


@dataclass(frozen=True)
class Verdict:
    """What every process learned at one point: the signal any got (0: none), and on how many nodes the platform gave
    an advance notice (a reclaim, host maintenance)."""

    signum: int = 0
    preempted: int = 0
    maintenance: int = 0

    @property
    def notices(self) -> int:
        return self.preempted + self.maintenance


class StopGuard:
    """One JAX hooks process's signals, watchdog, notice watcher, ledger and agreement."""

    def __init__(self, plan: Plan, failure_context: failures.FailureContext) -> None:
        self.plan, self.failure_context = plan, failure_context
        placed = plan.placed
        self.processes, self.is_chief = placed.world_size, placed.is_chief
        self.record = recorder.for_training(plan.outputs.job_dir, plan.topology.replica_name, placed.training_rank,
                                            placed.is_chief)
        self.request = StopRequest()
        self.watchdog = HangWatchdog(plan.options.hang_timeout, failure_context, plan.options.startup_timeout)
        self.watchdog.stop_deadline(self.request, plan.options.grace_period, self.holding)
        self.watchdog.progress = lambda: int(reads().value)  # the rows a batch read has read: a live read
        self.watcher = NoticeWatcher(metadata_host())  # one process per node: each watches its own node's server
        self.patience = patience(plan.options.grace_period)
        self.checkpoints: Location | None = None  # where the chief commits (once the loop knows)
        self.trained = 0  # the newest step this process trained
        self.committed: int | None = None  # the newest step it knows committed (resumed from, or committed since)
        self.heard: notice.Notice | None = None  # the last notice this process heard

    # ---- the run ------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def running(self) -> Iterator[StopGuard]:
        """The guard for the whole run: the start-up is a region a stop ends at once; a failure's last words say
        what a stop committed, or that a peer stopped."""
        self.request.install()
        self.request.enter(START_UP)
        self.watchdog.phase = "starting the training loop"
        self.watchdog.start()
        self.watcher.start()
        self.record.enter("preparation")
        try:
            yield self
            self.record.close("finished")
        except BaseException as exc:
            region = self.request.region
            self.request.enter(None)
            final = self.explain(exc, region)
            self.record.close("stopped" if isinstance(final, StopRequested) else "failed")
            if isinstance(final, StopRequested):
                self._bound_exit(final.exit_code)
            if final is not exc:
                raise final from None
            raise
        finally:
            self.request.enter(None)
            self.request.uninstall()
            self.watchdog.stop()
            self.watcher.stop()

    def doing(self, what: str) -> None:
        """The loop now does ``what`` (the hang watchdog's and the failure record's words)."""
        self.watchdog.phase = what

    def first_step_done(self) -> None:
        """The attempt's first step returned: the start-up is over (a stop is agreed on from now)."""
        self.request.enter(None)

    def exporting(self) -> None:
        """Training is complete and its final step committed: the export is a region a stop ends at once, and no hang
        clock holds it (only the stop's deadline)."""
        self.watchdog.end_startup()
        self.watchdog.timeout = 0.0
        self.watchdog.phase = "exporting the model"
        self.record.enter("export")
        self.request.enter(EXPORT)

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """A batch read: a region with patience (the attempt's first one stays in the start-up)."""
        if self.request.region == START_UP:
            yield
            return
        with self.request.interruptible(WAITING, self.patience):
            yield

    # ---- the agreement ------------------------------------------------------------------------------------
    def vote(self) -> Verdict:
        """Every process says what it heard since its last vote (its stop signal, its node's notice); the same
        verdict on every process (one all-gather when several)."""
        heard = self.watcher.take()
        if heard is not None:
            self.heard = heard
            log.warning("advance notice from the platform: %s on %s: every process commits the newest trained step "
                        "at the next step boundary (or evaluation batch), and training goes on until the signal",
                        heard, self.plan.topology.replica_name)
        mine = np.array([self.request.signum, int(heard is not None and heard.source == notice.PREEMPTED),
                         int(heard is not None and heard.source != notice.PREEMPTED)], dtype=np.int32)
        everyone = mine[None, :]
        if self.processes > 1:
            from jax.experimental import multihost_utils

            everyone = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 3)
        return Verdict(int(everyone[:, 0].max()), int((everyone[:, 1] > 0).sum()), int((everyone[:, 2] > 0).sum()))

    def agree(self, ok: bool) -> bool:
        """Whether the chief's ``ok`` (a checkpoint committed): every process hears the chief's answer."""
        if self.processes < 2:
            return ok
        from jax.experimental import multihost_utils

        return bool(np.asarray(multihost_utils.broadcast_one_to_all(np.int32(ok if self.is_chief else 0))))

    def notice_words(self, verdict: Verdict, step: int) -> str:
        """The chief's line once the checkpoint of ``step`` that ``verdict``'s notice asked for is committed."""
        if self.heard is not None and verdict.notices == 1:
            what = str(self.heard)
        else:
            kinds = [f"preempted ({notice.PREEMPTED})"] * bool(verdict.preempted) + \
                [f"host maintenance ({notice.MAINTENANCE})"] * bool(verdict.maintenance)
            what = f"{' and '.join(kinds)} on {verdict.notices} node{'s' * (verdict.notices != 1)}"
        return f"advance notice from the platform: {what}: checkpoint of step {step} committed; training goes on " \
               "until the signal"

    # ---- what a stop leaves -------------------------------------------------------------------------------
    def restart_words(self) -> str:
        """Where the restart resumes."""
        if self.committed is None or self.checkpoints is None:
            return "the restart starts from the first step (no checkpoint is committed)"
        return f"the restart resumes from {checkpoint_path(self.checkpoints, self.committed).name} " \
               f"(step {self.committed})"

    def holding(self, region: str | None = None) -> tuple[str, bool]:
        """What the job holds now, in words, and whether every step this process trained is committed (``region``:
        the start-up trained nothing in this attempt; the export comes after the final checkpoint)."""
        trained, newest = self.trained, self.committed
        if region == START_UP:
            return f"nothing trained in this attempt, so nothing to commit; {self.restart_words()}", True
        if region == EXPORT and newest == trained:
            return f"the checkpoint of the final step {trained} is committed; the restart exports the model again", True
        if newest is not None and newest >= trained:
            return f"the checkpoint of step {newest} is committed; {self.restart_words()}", True
        lost = trained - (newest or 0)
        return f"step {trained} was not committed: {self.restart_words()}, losing {lost} trained " \
               f"step{'s' * (lost != 1)}", False

    def explain(self, exc: BaseException, region: str | None) -> BaseException:
        """The failure to end with: a stop in a region with what it holds (posted for the peers); a peer that broke a
        collective while this process stops, or that stopped at once itself, as a stop; ``exc`` otherwise."""
        if isinstance(exc, Interrupted):
            words, kept = self.holding(exc.what)
            self._post_stop(exc.signum)
            return StopRequested(exc.signum, f"stopped by {signal.Signals(exc.signum).name} while "
                                             f"{self.watchdog.phase}: {words}", kept)
        if isinstance(exc, StopRequested) or not failures.is_peer_lost(exc):
            return exc
        stopped = None if self.request.requested else self._peer_stopped()
        if not self.request.requested and stopped is None:
            return exc
        signum = self.request.signum or stopped[1]  # type: ignore[index]
        who = f"by {signal.Signals(signum).name}" if self.request.requested else \
            f"with {stopped[0]} ({signal.Signals(signum).name})"  # type: ignore[index]
        words, kept = self.holding(region)
        return StopRequested(signum, f"stopped {who} while {self.watchdog.phase} (a stopping peer left the job's "
                                     f"collectives): {words}", kept)

    def _post_stop(self, signum: int) -> None:
        """Tell the other processes (JAX's coordination service) that this one stops at once on ``signum``."""
        client = _coordination()
        if client is not None:
            with contextlib.suppress(Exception):  # the service is gone with the chief: the peers see a lost peer
                client.key_value_set(STOPPED_KEY, f"{signum} {self.plan.topology.replica_name}", True)

    def _peer_stopped(self) -> tuple[str, int] | None:
        """Who stopped at once, and on which signal, if a process said so (``_post_stop``)."""
        client = _coordination()
        if client is None:
            return None
        try:
            text = client.key_value_try_get(STOPPED_KEY)
        except Exception:  # nothing posted, or the service is gone
            return None
        signum, _, who = str(text).partition(" ")
        return (who, int(signum)) if signum.isdigit() else None

    def _bound_exit(self, code: int) -> None:
        """A stopping process ends within its grace period: JAX's exit barrier (``jax.distributed.shutdown``, at
        exit) waits for every process, which a process that stops alone would wait out past the platform's kill.
        Once the record and the last line are written, what is left of the grace period ends it with ``code``."""
        if self.processes < 2:
            return
        grace = self.plan.options.grace_period
        left = max(grace - record_margin(grace) - self.request.since(), 1.0)
        timer = threading.Timer(left, shutdown.now, (code,))
        timer.daemon = True
        timer.start()


def _coordination() -> Any:
    """JAX's coordination-service client (None before ``jax.distributed.initialize``, or alone)."""
    from jax._src import distributed  # its client has no public accessor

    return distributed.global_state.client
