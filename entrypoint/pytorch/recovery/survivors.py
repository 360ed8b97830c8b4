"""The hooks loop's side of "survivors keep training": form or join the group, heal from a live replica, recover in
place.

A surviving process that loses a peer keeps its interpreter, its model and its data: it drops the broken
process group, waits with the others for the replacement (``membership.py``), forms the next generation,
and every rank whose state differs from its source's (the replacement, or a survivor that got one step
further or less) receives its source's live state (``healing.py``: rank 0's for a replicated model, under HSDP the
same local rank of the first node): model, optimizer, scheduler, position, history. A replacement asks to join
once its model is built, before placing it (HSDP places it on groups of the job's). Under HSDP by node the
survivors do not wait for it: they train on over the live nodes at once (``membership.py``: fewer replicas, the lost
node's share of each global batch skipped) and take it in at the step boundary the per-step vote agrees on
(``Rejoin``). Each step draws its randomness
from (seed, rank, step) (``state.reseed``), so the replayed step and the replacement's steps draw exactly what an
uninterrupted run would: at most the step in flight is lost.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from torch import nn

from entrypoint.errors import PeerError
from entrypoint.lifecycle import lost_work
from entrypoint.lifecycle.watch.peers import PeerBoard, Silent
from entrypoint.planning.plan import Plan
from entrypoint.planning.usercode import module_source
from entrypoint.pytorch.launch.collectives import TorchDistributed
from entrypoint.pytorch.launch.membership import GroupVerdict, Membership, fingerprint
from entrypoint.pytorch.recovery.healing import Healing, heal
from entrypoint.pytorch.recovery.host_copy import HostCopy
from entrypoint.pytorch.recovery.snapshots import FALLBACK, PeerSnapshots
from entrypoint.pytorch.state import TrainState

log = logging.getLogger("entrypoint.pytorch")
LOOP_SOURCE = Path(__file__).resolve().parents[1] / "loop" / "trainer.py"  # the hooks loop a replacement must share


def code_digest(plan: Plan) -> str:
    """The user's module, the loop's own code and the run's options: what a replacement must share."""
    digest = hashlib.sha256()
    digest.update(module_source(plan.require_code().target).read_bytes())
    digest.update(LOOP_SOURCE.read_bytes())
    options = asdict(plan.options)
    digest.update(json.dumps(options, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def model_fingerprint(model: nn.Module, plan: Plan, world_size: int, replica: str = "") -> dict[str, Any]:
    """This process's fingerprint: world size and processes per node, every parameter's name and shape (whole, as
    built), the code's digest; and its node (``replica``)."""
    shapes = [(name, tuple(t.shape)) for name, t in model.state_dict().items()]
    return fingerprint(world_size, shapes, code_digest(plan), plan.nproc_per_node, replica)


def drop_wrapper(state: TrainState) -> bool:
    """The old data-parallel wrapper let go; whether it was collected at once: a DDP's hooks and buffers (a cycle
    that holds the broken group) are, with a full ``gc.collect()`` (0.3 s here); a sharded model is its own wrapper,
    with nothing to collect, so its survivors skip it (an HSDP loss and a rejoin pause for it)."""
    wrapper, state.wrapped = state.wrapped, None
    if wrapper is None or wrapper is state.model:
        return False
    del wrapper
    gc.collect()
    return True


class Rejoin(Exception):
    """Every rank agreed at this step boundary to take a returning node in: the attempt ends and starts again."""


class InPlace:
    """Survivors keep training: the group's generations, and what each recovery cost."""

    def __init__(self, membership: Membership, comm: TorchDistributed, plan: Plan, me: tuple[str, str]) -> None:
        self.membership, self.comm, self.plan, self.me = membership, comm, plan, me
        self.fingerprint: dict[str, Any] = {}
        self.joining = False
        self.replica_size = 1  # the layout's: ranks holding one replica together (``healing.py``)
        self.fewer_since = 0  # the step from which the group trained with fewer replicas (``membership.fewer``)
        self.snapshots: PeerSnapshots | None = None  # FSDP: every rank heals from peer memory (``snapshots.py``)
        self.record: Any = None  # the ledger's recorder (``RunGuard``): a rollback's steps lost

    def keep_snapshots(self, local_size: int, timeout: float) -> None:
        """FSDP: each rank's shards in a peer's memory, taken at each commit (``snapshot``)."""
        self.snapshots = PeerSnapshots(self.comm, local_size, timeout, self.me)

    def snapshot(self, state: TrainState) -> HostCopy | None:
        """A commit: FSDP's snapshot in peer memory (nothing otherwise); its host copy, made in the background."""
        return self.snapshots.take(state) if self.snapshots is not None else None

    def finished(self) -> None:
        """The training ended: the last exchange ends with it, not in the export; no replacement is taken in."""
        if self.snapshots is not None:
            self.snapshots.settle()
            if self.comm.rank == 0 and (cost := self.snapshots.summary()):
                log.info("%s", cost)
        self.membership.finish()

    def train_on(self, replica_size: int, board: Callable[[], PeerBoard | None]) -> None:
        """HSDP by node: when a node is lost, the others train on without it (rank 0 leaves out the nodes whose
        heartbeats on ``board`` stopped) until its replacement joins at a step boundary."""
        def silent() -> set[int]:
            found = board()
            return {s.member.rank for s in found.silent()} if found is not None else set()

        self.membership.shrink_by, self.membership.lost = replica_size, silent

    def returning(self) -> bool:
        """Rank 0, for the step vote: a lost node's replacement announced all its ranks (take it in now)."""
        return self.comm.rank == 0 and self.membership.fewer and self.membership.ready()

    def form(self) -> bool:
        """Form generation 0 before anything is built, unless a job is in progress: then this process replaces a
        lost one (True), and joins once its model is built (``admit``)."""
        self.joining = self.membership.joining()
        if not self.joining:
            self.comm.form_group(self.membership.pg_store(0))
        return self.joining

    def admit(self, model: nn.Module) -> None:
        """A replacement whose model is built (not yet placed: HSDP by node places it on groups of the job's) asks to
        join the job in progress with its fingerprint, and is taken into the survivors' next generation."""
        if not self.joining:
            return
        self.fingerprint = model_fingerprint(model, self.plan, self.comm.world_size, self.me[0])
        self.membership.join(self.fingerprint)
        self._form()

    def enter(self, state: TrainState) -> Healing | None:
        """Generation 0 is formed (None), or, as a replacement taken in (``admit``), heal from a live replica
        (how)."""
        if not self.joining:
            self.fingerprint = model_fingerprint(state.model, self.plan, self.comm.world_size, self.me[0])
            return None
        done = self._heal(state, True)
        source = "its peer's memory" if self.snapshots is not None else "the live replica"
        log.info("joined the group (generation %d) at step %d, healed %s in %.2f s from %s, nothing "
                 "read from storage; fingerprints %s", self.membership.generation, state.step, done.words(),
                 done.seconds, source, " ".join(done.fingerprints))
        return done

    def _heal(self, state: TrainState, joining: bool) -> Healing:
        """From a live replica, or (FSDP) every rank from the newest snapshot every rank's copy of is there. Where it
        cannot, every rank says why in one line of its own (the failure's line names the lost node first) and raises
        PeerError: the job goes back to storage."""
        try:
            if self.snapshots is not None:
                self.snapshots.copied()  # the heal changes the state: the copy in flight is made first
                return self.snapshots.heal(state, joining, self.me)
            return heal(self.comm, state, joining, self.me, self.replica_size)
        except PeerError as exc:
            self.membership.abandon()
            log.warning("%s", exc)
            raise

    def started(self) -> None:
        """Generation 0 trains: replacements may join from now on."""
        self.membership.started(self.fingerprint)

    def recover(self, state: TrainState, in_flight: float, silent: list[Silent], rejoin: bool = False) -> int | None:
        """After losing a peer: drop the group, re-form it (with the replacement, or, HSDP, over the live nodes at
        once), heal; raises PeerError if not. ``rejoin``: every rank is at the step boundary the vote agreed on to take
        a returning node in (they all say so before any drops the group: none is still in a collective with it).
        Returns how many steps ran with fewer replicas when a returning node made the group whole again."""
        failed_at, step = time.time(), state.step
        if not rejoin and self.snapshots is not None and self.snapshots.off:  # agreed by every rank: none to heal from
            self.membership.abandon()
            raise PeerError(f"lost a peer at step {step} and there are no peer-memory snapshots to heal from "
                            f"({self.snapshots.off.split('; ')[0]}); {FALLBACK}")
        fewer_before = self.membership.fewer
        lost = list(dict.fromkeys(s.member.replica for s in silent))  # a node's ranks name it once
        if not rejoin:
            if self.snapshots is not None:
                self.snapshots.dropped()  # the exchange in flight ends with its group
            self.comm.drop_group()
        drop_wrapper(state)
        if not rejoin:
            log.warning("lost %s at step %d: keeping this process and re-forming the group (generation %d)",
                        ", ".join(lost) or "a peer", step, self.membership.generation + 1)
        verdict = self.membership.reform(step, {s.member.rank for s in silent})
        if rejoin:
            self.comm.drop_group()
        fewer = None
        if fewer_before and (rejoin or verdict.joiners) and state.recoveries:  # before healing: the joiner gets it
            fewer = self._fewer_steps(state)
        self._form()
        done = self._heal(state, False)
        if state.step < step and self.record is not None:  # FSDP: rolled back to a snapshot (the ledger's steps lost)
            self.record.rolled_back(state.step)
        if not rejoin:
            self._record(state, verdict, done, lost, in_flight, failed_at)
        if fewer is not None:
            log.info("%s joined again at step %d; %s", ", ".join(dict.fromkeys(
                self.membership.names(r) for r in sorted(verdict.joiners))) or "the lost replica", state.step,
                lost_work.Recovery(**state.recoveries[-1]).line())
        if self.snapshots is not None:
            log.info("group re-formed with %d ranks: every rank rolled back to its snapshot of step %d, healed %s "
                     "from peer memory in %.2f s, nothing read from storage; fingerprints %s", self.comm.world_size,
                     state.step, done.words(), done.seconds, " ".join(done.fingerprints))
        else:
            log.info("group re-formed with %d replicas at step %d, healed %s in %.2f s; fingerprints %s",
                     self.comm.world_size, state.step, done.words(), done.seconds, " ".join(done.fingerprints))
        if self.membership.fewer and not fewer_before:
            self.fewer_since = state.step
        if self.membership.fewer:
            self._say_fewer(state)
        return fewer

    def ended(self, state: TrainState) -> int | None:
        """The training ended while a node was out: how many steps ran with fewer replicas (None: none), recorded."""
        if not self.membership.fewer or not state.recoveries:
            return None
        fewer = self._fewer_steps(state)
        log.info("the training ended without the lost replica; %s", lost_work.Recovery(**state.recoveries[-1]).line())
        return fewer

    def _fewer_steps(self, state: TrainState) -> int:
        """The steps trained with fewer replicas up to now, kept in the last recovery's record."""
        fewer = state.step - self.fewer_since
        state.recoveries[-1]["fewer_replicas_steps"] = fewer
        return fewer

    def _form(self) -> None:
        """The generation's group: over every rank, or over the live nodes' (compacted)."""
        self.comm.form_group(self.membership.pg_store(), self.membership.members if self.membership.fewer else None)

    def _record(self, state: TrainState, verdict: GroupVerdict, done: Healing, lost: list[str], in_flight: float,
                failed_at: float) -> None:
        """What the loss cost, in the state's recoveries and the log's recovery line."""
        out = [r for r in range(self.membership.world_size) if r not in self.membership.members]
        # each rank of a replica names the replica: one name per replica lost (two processes a node named it twice)
        names = list(dict.fromkeys([self.membership.names(r) for r in sorted(verdict.joiners) or out]
                                   or lost or ["a peer"]))
        reached = max(done.steps)
        taken = self.snapshots.taken_at(state.step) if self.snapshots is not None else None
        if taken is not None and reached > state.step:  # rolled back: the training since the snapshot is lost too
            in_flight += max(failed_at - taken, 0.0)
        cost = lost_work.Recovery(
            replica=", ".join(names), lost_at_step=reached, resumed_from_step=state.step,
            lost_steps=max(reached - state.step, 0), lost_seconds=round(in_flight, 3), how="in_place",
            stalled_seconds=round(time.time() - failed_at, 3))
        state.recoveries.append(cost.to_dict())
        log.info("%s", cost.line())

    def _say_fewer(self, state: TrainState) -> None:
        """The group trains without some nodes: how, and until when."""
        members, world = self.membership.members, self.membership.world_size
        size = max(self.replica_size, 1)
        out = list(dict.fromkeys(self.membership.names(r) for r in range(world) if r not in members))
        log.warning("training on with %d of %d replicas from step %d without %s: each live replica keeps its own "
                    "share of every global batch (the lost replicas' shares of these steps are skipped), the gradients "
                    "are averaged over the %d live replicas, until the replacement joins at a step boundary",
                    len(members) // size, world // size, state.step, ", ".join(out), len(members) // size)
