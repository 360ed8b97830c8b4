"""The hooks loop's guard from its first hook on: stop signals in every phase, the hang watchdog and the stop's
deadline, the platform's advance notice, the job ledger's phases, and naming a lost peer.

It exists before anything is built (``running()`` wraps the whole loop), so no phase is left without it:

- **Signals.** SIGTERM/SIGINT set a flag that the step vote reads (``steps.py``: every rank stops at the same
  step and the chief commits it). Where nothing is half done and nothing new is trained (the start-up: building,
  forming the group, the restore; and the export, after the final checkpoint), the phase is an interruptible region
  (``signals.StopRequest``): the signal ends it at once, and the record and last line say that nothing was trained
  to commit, or that the final step is committed (``stopped``). The loop's other regions (a wait for a batch, a
  survivor's wait for its replacement) commit the last trained step first (``stops.py``).
- **The stop's deadline.** From the signal on, the process ends within its ``--grace-period`` (less a margin for its
  record: ``watchdog.record_margin``) whatever holds it, and its record says what is committed (``holding``): a
  node of one process enforces its grace period as a launcher does for its workers.
- **Hangs and live phases**: the watchdog's clocks; what the datasets read feeds it (``progress``).
- **Peers**: the group (survivors keep training: its first generation formed before anything is built, a
  replacement joining once its model exists, ``survivors.py``); every rank's heartbeat, so that a lost peer is named;
  a peer that stopped on a signal says so in the job's store (``post_stop``), so the ranks it left in a collective stop
  with it instead of calling it lost.

What comes with the parallel layout (the vote, non-finite steps, saves and stops, in-place recovery) is ``steps.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

from entrypoint import errors, failures
from entrypoint.cluster.placement import Placement
from entrypoint.errors import ConfigError, Interrupted, PeerError, StopRequested
from entrypoint.lifecycle import recorder
from entrypoint.lifecycle.signals import StopRequest
from entrypoint.lifecycle.waiting import LOG_EVERY, Wait
from entrypoint.lifecycle.watch import peers
from entrypoint.lifecycle.watch.peers import KeyValue
from entrypoint.lifecycle.watch.watchdog import HangWatchdog, reads, record_margin
from entrypoint.outputs import checkpoints, goodput
from entrypoint.planning.plan import Plan
from entrypoint.pytorch.defaults import HookContext
from entrypoint.pytorch.launch.collectives import Collectives
from entrypoint.pytorch.recovery.healing import Healing
from entrypoint.pytorch.recovery.notices import AdvanceNotice
from entrypoint.pytorch.recovery.survivors import InPlace
from entrypoint.pytorch.state import TrainState

log = logging.getLogger("entrypoint.pytorch")
START_UP = "the start-up"  # the interruptible region from the first hook to the first batch
EXPORT = "the export"  # the interruptible region after the final checkpoint


def check_placement(placed: Placement, comm: Collectives) -> None:
    """The framework's own rank and world size (``dist.get_rank()``, ``hvd.rank()``) must be the plan's."""
    if (comm.rank, comm.world_size) != (placed.rank, placed.world_size):
        raise ConfigError(comm.rank_variable, f"{comm.name} placed this process at rank {comm.rank} of "
                          f"{comm.world_size}, but the job's layout places it at rank {placed.rank} of "
                          f"{placed.world_size}")


class RunGuard:
    """Signals, watchdogs, the advance notice, the ledger's phases and the peers' heartbeats of one training run."""

    def __init__(self, plan: Plan, comm: Collectives, ctx: HookContext, failure_context: failures.FailureContext,
                 survivors: InPlace | None = None) -> None:
        self.plan, self.comm, self.ctx, self.failure_context = plan, comm, ctx, failure_context
        self.survivors = survivors  # survivors keep training: the group's generations (``survivors.py``)
        # The job ledger (the chief's; a no-op elsewhere): phases, steps, saves, restores, recoveries (goodput).
        self.record = recorder.for_training(plan.outputs.job_dir, plan.topology.replica_name, ctx.rank, ctx.is_chief)
        if survivors is not None:
            survivors.record = self.record  # an in-place rollback's steps lost (FSDP's snapshots)
        self.request = StopRequest()
        self.watchdog = HangWatchdog(plan.options.hang_timeout, failure_context, plan.options.startup_timeout)
        self.watchdog.stop_deadline(self.request, plan.options.grace_period, self.holding)
        self.watchdog.progress = lambda: int(reads().value)  # what the datasets read: a live read is not hung
        self.notice = AdvanceNotice(plan, ctx)  # the platform's advance notice (``notices.py``)
        self.board: peers.PeerBoard | None = None
        self.store: KeyValue | None = None  # the job's key-value store once the group exists (None: one process)

    # ---- the run ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def running(self) -> Iterator[RunGuard]:
        """Stop signals (the start-up ended at once by one), the hang watchdog and the stop's deadline for the whole
        run, the group's first generation formed (survivors keep training); a failure's last words say what a stop
        committed, or name a lost peer."""
        self.request.install()
        self.request.enter(START_UP)
        self.watchdog.phase = "starting the training loop"
        self.watchdog.start()
        self.notice.start()
        self.record.enter("preparation")
        try:
            if self.survivors is not None:  # before anything is built (a replacement joins in ``join``)
                self.starting("forming the process group")
                self.survivors.form()
            yield self
            self.record.close("finished")
        except BaseException as exc:
            region = self.request.region
            self.request.enter(None)
            final = self.explain(exc, region)
            self.record.close("stopped" if isinstance(final, StopRequested) else "failed")
            if final is not exc:
                raise final from None
            raise
        finally:
            self.request.enter(None)
            self.request.uninstall()
            self.watchdog.stop()
            self.notice.stop()
            if self.board is not None:
                self.board.stop()

    def explain(self, exc: BaseException, region: str | None = None) -> BaseException:
        """The failure to end with: a stop in a region with what it committed, a lost peer while stopping (or that
        stopped on a signal) as a stop, a lost peer named by the heartbeats; ``exc`` otherwise (``region``: the one
        the loop was in)."""
        if isinstance(exc, Interrupted):
            words, kept = self.holding(exc.what)
            return StopRequested(exc.signum, f"stopped by {signal.Signals(exc.signum).name} while "
                                             f"{self.watchdog.phase}: {words}", kept)
        if isinstance(exc, StopRequested) or not failures.is_peer_lost(exc):
            return exc
        stopped = self.peer_stopped()
        if self.request.requested or stopped is not None:
            words, kept = self.holding(region)
            return StopRequested(self.request.signum or int(stopped["signum"] if stopped else signal.SIGTERM),
                                 f"{self.stop_words(stopped)} while {self.watchdog.phase}: {words}", kept)
        return self._name_the_lost(exc)

    def stop_words(self, stopped: dict[str, Any] | None) -> str:
        """``stopped by SIGTERM`` (this process's signal), else ``stopped with workerpool1-0 (SIGTERM)``."""
        if self.request.requested or stopped is None:
            return f"stopped by {signal.Signals(self.request.signum or signal.SIGTERM).name}"
        return f"stopped with {stopped['who']} ({signal.Signals(int(stopped['signum'])).name})"

    def holding(self, region: str | None = None) -> tuple[str, bool]:
        """What the job holds now, in words, and whether every step this process trained is committed: the newest
        committed checkpoint against its trained step (``region``: the start-up trained nothing; the export comes
        after the final checkpoint)."""
        trained = self.watchdog.step
        found = checkpoints.committed(self.ctx.checkpoint_dir, warn=False)
        newest = found[-1][0] if found else None
        where = f"the restart resumes from {found[-1][1].name} (step {newest})" if found else \
            "the restart starts from the first step (no checkpoint is committed)"
        if region == START_UP:
            return f"nothing trained in this attempt, so nothing to commit; {where}", True
        if region == EXPORT and newest == trained:
            return f"the checkpoint of the final step {trained} is committed; the restart exports the model again", True
        if newest is not None and newest >= trained:
            return f"the checkpoint of step {newest} is committed; {where}", True
        lost = trained - (newest or 0)
        return f"step {trained} was not committed: {where}, losing {lost} trained step{'s' if lost != 1 else ''}", \
            False

    def left(self) -> float:
        """Seconds left of the stop's grace period before this process ends itself (its deadline)."""
        grace = self.plan.options.grace_period
        return max(grace - record_margin(grace) - self.request.since(), 0.0)

    # ---- phases and beats --------------------------------------------------------------------------
    def starting(self, what: str) -> None:
        """The loop starts ``what``: within the start-up's ``--startup-timeout``; after it, within ``--hang-timeout``
        (that clock starts now)."""
        self.watchdog.beat(self.watchdog.step, what)

    def doing(self, what: str) -> None:
        """The loop is now doing ``what`` (the clock keeps running: the step before and this share it)."""
        self.watchdog.phase = what

    def beat(self, step: int) -> None:
        """Training goes on at ``step`` (after the start-up, the step clock starts now)."""
        self.watchdog.beat(step, "waiting for the first batch" if self.watchdog.starting_up else
                           "waiting for the next batch")

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        """A phase of the job ledger (``evaluation``) around the loop's block."""
        return self.record.phase(name)

    def goodput_so_far(self) -> dict[str, Any]:
        """The job's goodput so far, this attempt's steps included (the training summary's ``goodput``)."""
        self.record.flush()
        return goodput.so_far(self.plan.outputs.job_dir)

    def restored(self, step: int) -> None:
        """The training goes on after ``step`` (what the newest checkpoint held; 0 for a fresh start)."""
        self.record.restored(step)
        self.record.enter("preparation")

    def exporting(self) -> None:
        """The final checkpoint is committed: the export is a region a stop ends at once."""
        self.watchdog.end_startup()  # nothing was left to train (a rerun at the final checkpoint)
        if self.survivors is not None:  # a lost node's replacement still starting has nothing left to join
            self.survivors.finished()
        self.watchdog.phase = "exporting the model (chief) and waiting for it (the others)"
        self.record.enter("export")
        self.request.enter(EXPORT)

    # ---- peers ------------------------------------------------------------------------------------
    def admit(self, model: Any) -> bool:
        """The model is built: a replacement joins the job in progress now, before its model is placed (whether it
        is one: its weights then come from a live replica)."""
        if self.survivors is None or not self.survivors.joining:
            return False
        self.starting("joining the job in progress")
        self.survivors.admit(model)
        return True

    def join(self, state: TrainState) -> Healing | None:
        """Every rank built its model: publish this rank's heartbeat (None: the group's first generation), or join a
        job in progress as a replacement, healed from a live replica's state (how); the framework's ranks checked."""
        self.starting("forming the process group")
        joined = self.survivors.enter(state) if self.survivors is not None else None
        if joined is None:
            self.meet()
        members = self.join_board(joined.members if joined is not None else None)
        if self.survivors is not None and members is not None:
            self.survivors.membership.names = lambda rank: members[rank].replica
        check_placement(self.plan.placed, self.comm)  # the group exists: its ranks must be the plan's
        return joined

    def meet(self) -> None:
        """Every rank built its datasets and model before the first collective; the ranks still building are
        named every 20 s and, at ``--timeout``, in the failure (a collective's timeout names nobody)."""
        store = self.comm.heartbeat_store()
        if store is None:
            return
        rank, world = self.ctx.rank, self.ctx.world_size
        key = f"trainer/built/{self.plan.topology.trial or ''}/"
        store.put(f"{key}{rank}", "1")
        wait = Wait(self.plan.options.timeout, first_after=LOG_EVERY, logger=log)

        def pending() -> tuple[str, str] | None:
            missing = [r for r in range(world) if store.fetch(f"{key}{r}") is None]
            if not missing:
                return None
            return ", ".join(self._rank_name(r) for r in missing), "building its datasets and model"

        wait.until(pending)

    def _rank_name(self, rank: int) -> str:
        """A rank as users know it: its replica (``workerpool1[0]``) and rank."""
        placed, peers_ = self.plan.placed, self.plan.topology.training_peers()
        node = rank // max(placed.local_world_size, 1)
        return f"{peers_[node].name} (rank {rank})" if node < len(peers_) else f"rank {rank}"

    def join_board(self, names: list[Any] | None) -> list[peers.Member] | None:
        """Every rank says who it is and starts its heartbeat (survivors use them to name a lost peer); the
        members (None without a store: one process)."""
        if names is None:
            names = self.comm.gather_object((self.plan.topology.replica_name, socket.gethostname()))
        self.store = self.comm.heartbeat_store()
        if self.store is None:
            return None
        members = [peers.Member(rank, replica, host) for rank, (replica, host) in enumerate(names)]
        chief = self.plan.topology.chief_host_port()  # the liveness port: where every peer reaches this host
        address = peers.address_towards(chief[0]) if chief is not None else None
        self.board = peers.PeerBoard(self.store, members[self.ctx.rank], members, address=address).start()
        self.watchdog.board = self.board
        return members

    def _stop_key(self) -> str:
        return f"trainer/stopped/{self.plan.topology.trial or ''}"

    def post_stop(self, step: int) -> None:
        """Tell the job's store that this process stops on a signal after ``step`` (the first to say so is kept):
        the peers it leaves in a collective stop with it instead of calling it lost."""
        if self.store is None or self.peer_stopped() is not None:
            return
        who = self._rank_name(self.ctx.rank)
        with contextlib.suppress(Exception):  # a store that is gone: the peers see a lost peer, as before
            self.store.put(self._stop_key(), json.dumps({"who": who, "step": step,
                                                         "signum": self.request.signum or signal.SIGTERM}))

    def peer_stopped(self) -> dict[str, Any] | None:
        """What the first process that stopped on a signal posted (``post_stop``), if one did."""
        if self.store is None:
            return None
        try:
            text = self.store.fetch(self._stop_key())
        except Exception:  # the store went with its host: nothing can be learned there
            return None
        return dict(json.loads(text)) if text else None

    def _name_the_lost(self, exc: BaseException) -> BaseException:
        """A lost peer, named by the heartbeats or its liveness port (gloo only says an address and a port), or the
        peer gone on a failure of its own, named by its record (``failures.record_verdict``: it was not lost);
        ``exc`` otherwise."""
        if self.board is None:
            return exc
        silent = self.board.silent()
        if not silent:
            return exc
        step = self.board.step
        lost, failed = [], []
        for gone in silent:
            record = failures.record_verdict(self.failure_context, gone.member.replica, gone.member.rank,
                                             errors.PEER_LOST, f"{peers.describe([gone])}; the others stopped at "
                                             f"step {step}")
            if record.reported_by:
                lost.append(gone)
            else:
                failed.append(f"{gone.member} ended on its own failure ({record.failure_class}: "
                              f"{failures.clip(record.message, 200)})")
        said = "; ".join([*([f"lost {peers.describe(lost)}"] if lost else []), *failed])
        return PeerError(f"{said} at step {step} ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})")

    def wait_for_commit(self, step: int) -> bool:
        """A rank that leaves the commit to the chief: wait (within the grace period) until the checkpoint of ``step``
        is committed; whether it is."""
        path = checkpoints.checkpoint_path(self.ctx.checkpoint_dir, step)
        deadline = time.monotonic() + max(self.left() - 0.5, 0.0)
        while True:
            if checkpoints.is_committed(path):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
