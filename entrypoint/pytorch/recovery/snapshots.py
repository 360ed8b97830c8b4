"""FSDP without replicas heals from peer memory: each rank's shards, in host memory here and on a peer.

A model sharded over every rank (FSDP) has no live replica: a lost node takes shards no other process holds. So at
each commit (``StepGuard.checkpoint``: every ``--checkpoint-every`` step and every epoch's end) every rank keeps a
host copy of its own training state (``healing.live_shards``: its parameter shards and their optimizer state, the
scheduler, the position in the data, the history) with a fingerprint of it (``healing.tensors_digest``), and sends
one to its **peer**, the same local rank on the next node in ring order (rank ``r`` -> ``(r + L) % W``, ``L``
processes per node, ``W`` ranks), which keeps it beside its own. The copy is made in a background thread while the
next step's forward and backward run, and the optimizer's step waits for it (``host_copy.py``: the state does not move
under it; the wait is the cost left on the step, said in the first snapshot's line and, in all, at the training's
end); a commit's sharded checkpoint is written from the same copy (no second one). The fingerprint, the
serialization and the exchange run in that thread too, on a gloo group of their own (formed with the generation, at
its first commit), off the training step. Two snapshots of each
kind are kept, and no fewer will do: the ranks of a lost node can be cut off at different points of one exchange (one
rank's copy of step s arrived, its neighbour's did not), so every rank must still hold step s - 1's copy of every kind
until the next exchange starts; the oldest copy of its peer's is dropped then, as its own oldest is, and the buffers
of the exchange are freed as soon as they are sent or read, so its peak is ``memory.COPIES`` (5) copies of the
rank's state, 4 between exchanges.

The copies must fit in the host: before the first, every rank works out what its copies take (``memory.COPIES`` x the
bytes of its shards and optimizer state) and reads what its node can give (``memory.available``: MemAvailable, or
the room under the container's cgroup limit); one all-gather shows every rank every node's sum, and where a node's
copies exceed ``memory.MARGIN`` of what it can give, every rank turns the snapshots off for the job (the chief says
so in one line: a loss then restarts the job from storage).

When a node is lost the survivors keep their processes and wait for its replacement (``survivors.py``, as the
replicated model's do). Once it is taken in, every rank says which snapshots it holds; every rank rolls back to the
newest step of which every rank's copy is there (a survivor's its own, a replacement's at its peer), the replacement
receiving its copy from its peer rank to rank over the re-formed group; nothing is read from storage. Every rank's
fingerprint after adopting it must equal the one its snapshot was taken with. The random streams follow from
(seed, rank, step) (``state.reseed``), so the job trains on exactly as one resumed from a checkpoint of that step.
Right after the heal every rank whose peer does not hold its snapshot of that step (the replacement's ring
predecessor: the replacement came back with no copy) sends it again, in the background on the exchange's group, so a
second loss before the next snapshot heals from memory too. Storage is the fallback, said in one line (a
``PeerError``: the job restarts from its newest checkpoint): no step of
which every copy is there (a node lost with its peer, or before the first commit), a copy that does not match its
fingerprint; a replacement of another world size or model is refused before (``membership.py``).
"""

from __future__ import annotations

import copy
import io
import logging
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from entrypoint.cluster import memory
from entrypoint.errors import PeerError
from entrypoint.pytorch.launch.collectives import TorchDistributed
from entrypoint.pytorch.recovery.healing import Healing, adopt_shards, state_digest, tensors_digest
from entrypoint.pytorch.recovery.host_copy import HostCopy, references
from entrypoint.pytorch.state import TrainState

log = logging.getLogger("entrypoint.pytorch")
KEEP = 2  # snapshots of each kind kept: the newest, and the one before (an exchange the loss cut short)
OFF_SWITCH = "--peer-snapshots off"
FALLBACK = "the job restarts from its newest checkpoint in storage"


def state_bytes(state: TrainState) -> int:
    """Bytes of this rank's shards and their optimizer state (what a snapshot copies), counted without a copy."""
    def size(value: Any) -> int:
        local = value.to_local() if hasattr(value, "to_local") else value
        return int(local.numel() * local.element_size()) if isinstance(local, torch.Tensor) else 0

    tensors = list(state.model.state_dict().values())
    tensors += [value for entry in state.optimizer.state.values() for value in entry.values()]
    return sum(size(t) for t in tensors)


def peer_of(rank: int, local: int, world: int) -> int:
    """The rank that keeps ``rank``'s copy: the same local rank on the next node, in ring order."""
    return (rank + local) % world


class PeerSnapshots:
    """This rank's snapshots (its own, and its ring predecessor's copy), the exchange in flight, and the heal."""

    def __init__(self, comm: TorchDistributed, local_size: int, timeout: float, me: tuple[str, str] = ("", "")) -> None:
        self.comm, self.local, self.timeout, self.me = comm, max(local_size, 1), timeout, me
        self.off = ""  # why the memory guard turned the snapshots off for the job (empty: on)
        self.guarded = False  # the guard ran (at the first commit)
        self.own: dict[int, dict[str, Any]] = {}  # step -> {"payload", "digest", "at"}: this rank's
        self.held: dict[int, dict[str, Any]] = {}  # step -> the same, of rank (r - L) % W
        self.group: Any = None  # the exchange's gloo group, per generation
        self.thread: threading.Thread | None = None
        self.failed = ""  # the last exchange's failure, in words
        self.exchange_seconds = 0.0  # the last exchange's time (in the background)
        self.copying: HostCopy | None = None  # the last snapshot's host copy (made in the background)
        self.waits: list[float] = []  # what the training thread waited for each copy (the step's cost)
        self.joins: list[float] = []  # what it waited at a snapshot for the exchange before it to end
        self._hook: Any = None  # the optimizer's step pre-hook (it waits for the copy in flight)
        self._hooked: Any = None  # the optimizer it is registered on
        self.peer = -1  # the rank the last exchange sent to
        self.bytes = 0  # one snapshot's size, serialized
        self._lock = threading.Lock()
        self._said = False

    # ---- at a commit -----------------------------------------------------------------------------
    def take(self, state: TrainState) -> HostCopy | None:
        """Every rank at the same commit: a host copy of this rank's state, made in the background while the next
        step's forward and backward run (``host_copy.py``; the optimizer's step waits for it), fingerprinted and sent
        to its peer (the exchange before it is finished first). The copy, or None where none is taken."""
        world = self.comm.world_size
        if world <= self.local or self.off:  # one node: no peer on another node; or the host cannot hold them
            return None
        if not self.guarded and not self.fits(state):
            return None
        started = time.perf_counter()
        if self.thread is not None:  # the exchange before this one still runs: the step waits for it
            self.settle()
            self.joins.append(time.perf_counter() - started)
        if self.group is None:  # every rank at its generation's first commit, in step
            self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.timeout))
        copying = self.copying = HostCopy(*references(state, world), state.step)
        rank = self.comm.rank
        self.thread = threading.Thread(
            target=self._exchange, name="peer-snapshot", daemon=True,
            args=(state.step, copying, peer_of(rank, self.local, world), (rank - self.local) % world))
        self.thread.start()
        self._guard_step(state.optimizer)
        return copying

    def _guard_step(self, optimizer: Any) -> None:
        """The optimizer's next step waits for the copy in flight (a step pre-hook, registered once per optimizer);
        one that takes no hook is waited for at once."""
        if not hasattr(optimizer, "register_step_pre_hook"):
            self.copied()
            return
        if self._hooked is not optimizer:
            if self._hook is not None:
                self._hook.remove()
            self._hook, self._hooked = optimizer.register_step_pre_hook(lambda *_: self.copied()), optimizer

    def copied(self) -> None:
        """The training thread, before anything changes the state: the copy in flight is made (what it waited is
        the step's cost of the snapshots)."""
        if self.copying is not None and self.copying.waited is None:
            self.waits.append(self.copying.wait())

    def fits(self, state: TrainState) -> bool:
        """The memory guard, every rank before its first snapshot: one all-gather of every rank's state bytes and
        what its node can give; where any node cannot hold its copies, the snapshots are off for the job."""
        self.guarded = True
        replica, host = self.me
        views = self.comm.gather_object((replica, host, state_bytes(state), memory.available().available))
        names: dict[str, list[str]] = {}
        for name, where, _, _ in views:
            if name not in names.setdefault(where, []):
                names[where].append(name)
        label = {where: f"{where} ({', '.join(found)})" if any(found) else where for where, found in names.items()}
        needs = memory.node_needs([(label[where], size, free) for _, where, size, free in views])
        worst = memory.tightest(needs)
        if worst.fits:
            if self.comm.rank == 0:
                log.info("peer snapshots fit in host memory: node %s (at most %d%% of what it can give)",
                         worst.text(), int(memory.MARGIN * 100))
            return True
        self.off = (f"peer snapshots are off for this job: node {worst.text()}, more than "
                    f"{int(memory.MARGIN * 100)}% of it; a lost node restarts the job from its newest checkpoint in "
                    f"storage ({OFF_SWITCH} to silence this)")
        if self.comm.rank == 0:
            log.warning(self.off)
        return False

    def _exchange(self, step: int, copying: HostCopy, peer: int, source: int) -> None:
        started = time.perf_counter()
        try:
            payload = copying.run()
        except Exception as exc:  # the peer's receive fails on its timeout: it keeps the copy before this one
            self.failed = f"the host copy of step {step}'s snapshot failed: {exc}"
            return
        own = {"payload": payload, "digest": tensors_digest(payload["model"], payload["optimizer"]["state"]),
               "at": time.time()}
        self._starting(step, own)
        try:
            sends, self.bytes = self._post(own, peer)
            got = self._fetch(source)
            _sent(sends)
        except Exception as exc:  # a peer lost mid-exchange: the snapshot before this one is what it holds
            self.failed = f"the exchange of step {step}'s snapshot with ranks {peer} and {source} failed: {exc}"
            return
        del sends  # sent: the serialized copy is freed before the received one is read
        held = _loaded(got)
        del got
        self._keep(self.held, step, held)
        self.failed, self.exchange_seconds = "", time.perf_counter() - started
        self.peer = peer

    def _starting(self, step: int, own: dict[str, Any]) -> None:
        """An exchange starts: this rank's newest snapshot kept (its oldest dropped), and its peer's oldest dropped
        (a loss cut short now rolls back to the newest of both kinds; the one before is no rank's common step)."""
        self._keep(self.own, step, own)
        with self._lock:
            for old in sorted(self.held)[:-1]:
                del self.held[old]

    def _keep(self, kind: dict[int, dict[str, Any]], step: int, snapshot: dict[str, Any]) -> None:
        with self._lock:
            kind[step] = snapshot
            for old in sorted(kind)[:-KEEP]:
                del kind[old]

    def settle(self) -> None:
        """The exchange in flight ends (before the group is dropped, or the next one starts); the first one that
        succeeded says what it cost (the chief)."""
        if self.thread is not None:
            self.thread.join(self.timeout)  # the copy is made before the exchange: nothing waits for it after this
            self.thread = None
            copying, self.copying = self.copying, None
            if not self.failed and not self._said and self.comm.rank == 0 and copying is not None:
                self._said = True
                self._say(copying)

    def _say(self, copying: HostCopy) -> None:
        waited = "no step followed it" if copying.waited is None else \
            f"the next step waited {copying.waited:.3f} s for it"
        log.info("peer snapshot of step %d: this rank's shards and optimizer state (%.1f MiB) copied to host memory "
                 "in %.3f s beside the next step's forward and backward (%s), fingerprinted and exchanged with rank "
                 "%d in %.2f s in the background; each rank keeps its own two newest and its peer's (at most %d "
                 "copies while one is exchanged)", copying.step, self.bytes / 2**20, copying.seconds, waited,
                 self.peer, self.exchange_seconds, memory.COPIES)

    def summary(self) -> str:
        """What the snapshots cost the training steps in all (the chief says it at the training's end): the waits
        for their host copies, and for an exchange still in flight at the next snapshot."""
        if not self.waits:
            return ""
        waits, joins = self.waits, self.joins
        return (f"peer snapshots: {len(waits)} host copies made beside the training steps; the steps waited "
                f"{sum(waits):.3f} s for them in all ({sum(waits) / len(waits):.3f} s per copy, at most "
                f"{max(waits):.3f} s), and {sum(joins):.3f} s for an exchange still in flight at the next snapshot")

    def dropped(self) -> None:
        """The generation's group is gone (a lost peer): so is the exchange's; the next generation forms its own."""
        self.settle()
        self.group = None

    # ---- the heal --------------------------------------------------------------------------------
    def heal(self, state: TrainState, joining: bool, me: tuple[str, str]) -> Healing:
        """Every rank rolls back to the newest snapshot every rank's copy of is there (a replacement's from its peer,
        rank to rank); fingerprints compared. Raises PeerError (the checkpoint path), naming why, when it cannot."""
        comm, started = self.comm, time.perf_counter()
        world, rank = comm.world_size, comm.rank
        with self._lock:
            own, held = ([], []) if joining else (sorted(self.own), sorted(self.held))
        views = comm.gather_object((state.step, joining, me, own, held, self.off))
        off = next((view[5] for view in views if view[5]), "")
        if off:  # the memory guard turned them off for the job at its first commit (every survivor says so)
            raise PeerError(f"no peer-memory snapshots to heal from ({off.split('; ')[0]}); {FALLBACK}")
        self.guarded = True  # a replacement takes the job's decision (on, or there would be nothing to heal from)
        joiners = [r for r, view in enumerate(views) if view[1]]
        holders = {r: peer_of(r, self.local, world) for r in joiners}
        both = [r for r in joiners if views[holders[r]][1]]
        if both:
            raise PeerError(f"the peer-memory snapshots of rank {both[0]} are gone: it and its peer (rank "
                            f"{holders[both[0]]}) were both lost; {FALLBACK}")
        steps = [set(views[holders[r]][4]) if r in holders else set(views[r][3]) for r in range(world)]
        common = set.intersection(*steps)
        if not common:
            short = min(range(world), key=lambda r: len(steps[r]))
            raise PeerError(f"no peer-memory snapshot of one step is held for every rank (rank {short}'s: "
                            f"{sorted(steps[short]) or 'none'}; none is taken before the first commit); {FALLBACK}")
        step = max(common)
        for joiner, holder in holders.items():
            if holder == rank:
                comm.send_object({**self.held[step], "recoveries": state.recoveries}, joiner)
        if joining:
            got = comm.recv_object(holders[rank])
            recoveries = got["recoveries"]
            self._keep(self.own, step, {key: got[key] for key in ("payload", "digest", "at")})
        else:
            got, recoveries = self.own[step], list(state.recoveries)
        adopt_shards(state, copy.deepcopy(got["payload"]))  # what is kept never aliases the training state
        state.recoveries = list(recoveries)  # the survivors' record of what losses cost, not the snapshot's
        self._forget_after(step)
        fingerprints = comm.gather_object((state_digest(state), got["digest"]))
        differ = [r for r, (now, taken) in enumerate(fingerprints) if now != taken]
        if differ:
            raise PeerError(f"the peer-memory snapshot of step {step} does not match its fingerprint on " + ", ".join(
                f"rank {r} ({fingerprints[r][0]}, taken as {fingerprints[r][1]})" for r in differ) + f"; {FALLBACK}")
        self._send_again(step, [r for r in range(world) if step not in views[peer_of(r, self.local, world)][4]])
        return Healing(joiners, [int(v[0]) for v in views], [tuple(v[2]) for v in views], time.perf_counter() - started,
                       holders, [str(f[0]) for f in fingerprints])

    def _send_again(self, step: int, owners: list[int]) -> None:
        """Every rank in step after a heal: each of ``owners`` (whose peer does not hold its snapshot of ``step``: a
        replacement, or a survivor whose exchange the loss cut short) sends its own to its peer again, in the
        background as the exchange does, so a loss before the next snapshot heals from memory too."""
        if not owners:
            return
        if self.group is None:  # the generation's exchange group, formed here (every rank is in the heal)
            self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.timeout))
        world, rank = self.comm.world_size, self.comm.rank
        peer, source = peer_of(rank, self.local, world), (rank - self.local) % world
        self.thread = threading.Thread(target=self._resend, name="peer-snapshot-again", daemon=True, args=(
            step, peer if rank in owners else None, source if source in owners else None))
        self.thread.start()

    def _resend(self, step: int, peer: int | None, source: int | None) -> None:
        started = time.perf_counter()
        try:
            sends = self._post(self.own[step], peer)[0] if peer is not None else []
            if source is not None:
                got = self._fetch(source)
                self._keep(self.held, step, _loaded(got))
                log.info("holds rank %d's peer snapshot of step %d again (%.1f MiB, sent again after the heal in "
                         "%.2f s, in the background): a loss of its node before the next snapshot heals from memory",
                         source, step, got.numel() / 2**20, time.perf_counter() - started)
            _sent(sends)
        except Exception as exc:  # a peer lost again meanwhile: its next loss falls back to storage, as it says
            self.failed = f"sending step {step}'s snapshot again to rank {peer} / from rank {source} failed: {exc}"

    def _post(self, snapshot: dict[str, Any], peer: int) -> tuple[list[Any], int]:
        """``snapshot`` serialized and sent to ``peer`` on the exchange's group (its size, then its bytes: the
        buffer's own, not a copy); the sends in flight and the bytes."""
        buffer = io.BytesIO()
        torch.save(snapshot, buffer)
        data = torch.frombuffer(buffer.getbuffer(), dtype=torch.uint8)
        return [dist.isend(torch.tensor([data.numel()], dtype=torch.int64), peer, group=self.group),
                dist.isend(data, peer, group=self.group)], data.numel()

    def _fetch(self, source: int) -> torch.Tensor:
        """The serialized snapshot ``source`` sends (``_post``)."""
        size = torch.zeros(1, dtype=torch.int64)
        dist.recv(size, source, group=self.group)
        got = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.recv(got, source, group=self.group)
        return got

    def _forget_after(self, step: int) -> None:
        """Snapshots newer than the one every rank rolled back to describe steps that are trained again."""
        with self._lock:
            for kind in (self.own, self.held):
                for newer in [s for s in kind if s > step]:
                    del kind[newer]

    def taken_at(self, step: int) -> float | None:
        """When the snapshot of ``step`` was taken (wall clock), if this rank holds its own."""
        snapshot = self.own.get(step)
        return float(snapshot["at"]) if snapshot is not None else None


def _sent(sends: list[Any]) -> None:
    """The sends of ``_post`` completed."""
    for sent in sends:
        if sent is not None:
            sent.wait()


def _loaded(got: torch.Tensor) -> dict[str, Any]:
    """A snapshot from the bytes ``_fetch`` received."""
    return torch.load(io.BytesIO(got.numpy().data), weights_only=False)
