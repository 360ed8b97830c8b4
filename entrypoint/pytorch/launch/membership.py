"""Survivors keep training: who is in the process group, generation by generation, through the job's store.

When a peer is lost, the surviving processes do not exit. Each one says so in the job's store (the chief's
TCPStore, which outlives any other replica) for the next generation; the replacement the platform restarts
at the lost replica's address finds the job live and announces itself with a fingerprint of what it would
train. Rank 0 decides: once every rank is either a survivor or a fresh replacement whose fingerprint
matches its own, the next generation is formed (a new process group over a fresh prefix of the same
store); a replacement that differs (model shape, world size, code) is refused with a line naming what
differs, and a rank that does not come back within ``--timeout`` ends the attempt: both send everyone
back to the checkpoint path (exit 129, the platform restarts the job). If rank 0 itself is lost, so is
the store, and the checkpoint path is the only one. docs/recovery.md compares the two paths.

Keys (under ``trainer/<run>/live/``): ``started`` (generation 0 trains), ``finished`` (the training ended: a
replacement still starting ends at once, with nothing to do), ``gen`` (the current generation),
``joins/<rank>`` (how many replacements of that rank announced themselves), ``join/<rank>/<n>`` (the n-th
one's fingerprint), ``accepted/<rank>`` (the last one taken in), ``g<n>/here/<rank>`` (a survivor for
generation n), ``g<n>/verdict`` (rank 0's decision), ``abandoned`` (the survivors gave up: the attempt goes back to its
checkpoint, and a node restarted now meets the chief's next store instead of joining it).

**Fewer replicas** (``shrink_by``: HSDP by node, a node is one replica of ``shrink_by`` ranks): rank 0 does not wait
for a lost node's replacement. Once every rank that is not here is silent (its heartbeat stopped: ``lost``), the
generation is formed over the live nodes' ranks at once (``GroupVerdict.members``, whole nodes, in rank order: the
group's ranks are compacted, the placement's are kept for data and random streams); a rank of a node that is only
partly here is left out with it. While a node is out, rank 0 asks at every step whether all of its replacement's
ranks announced themselves (``ready``): the step vote carries it, and at that step boundary every rank re-forms the
group with them (a generation with every rank again).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from entrypoint.errors import PeerError
from entrypoint.lifecycle.waiting import LOG_EVERY, Wait
from entrypoint.planning import registry
from entrypoint.pytorch.framework import PEER_SNAPSHOTS_DEFAULT, RECOVERY_DEFAULT
from entrypoint.pytorch.launch.store import abandoned_key, job_run_id

log = logging.getLogger("entrypoint.pytorch")
_POLL = 0.05


def fingerprint(world_size: int, shapes: list[tuple[str, tuple[int, ...]]], code: str, per_node: int = 0,
                replica: str = "") -> dict[str, Any]:
    """What every member of a group must agree on: world size (and processes per node), parameter names and shapes,
    the code's digest; and who it is (``replica``, to name a replacement that is refused)."""
    shape_text = ";".join(f"{name}:{'x'.join(map(str, shape))}" for name, shape in shapes)
    return {"world_size": world_size, "parameters": len(shapes),
            "shapes": hashlib.sha256(shape_text.encode()).hexdigest()[:16], "code": code,
            "shape_list": shape_text[:4000], "per_node": per_node, "replica": replica}


def differences(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    """What differs between two fingerprints, in words ("" when they agree)."""
    found = []
    if mine.get("per_node") and theirs.get("per_node") and mine["per_node"] != theirs["per_node"]:
        found.append(f"--nproc-per-node {theirs['per_node']} instead of {mine['per_node']} (world size "
                     f"{theirs.get('world_size')} instead of {mine.get('world_size')})")
    elif mine.get("world_size") != theirs.get("world_size"):
        found.append(f"world size {theirs.get('world_size')} instead of {mine.get('world_size')}")
    if mine.get("shapes") != theirs.get("shapes"):
        found.append(f"model parameters ({theirs.get('parameters')} tensors) of other shapes than the group's "
                     f"({mine.get('parameters')}): {_first_difference(mine, theirs)}")
    if mine.get("code") != theirs.get("code"):
        found.append("another version of the code (its module's digest differs)")
    return "; ".join(found)


def _first_difference(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    a, b = str(mine.get("shape_list", "")).split(";"), str(theirs.get("shape_list", "")).split(";")
    for x, y in zip(a, b, strict=False):
        if x != y:
            return f"{y} where the group has {x}"
    return f"{len(b)} tensors where the group has {len(a)}"


class JobFinished(Exception):
    """The training ended while this replacement was starting (HSDP's survivors finished without it)."""


@dataclass
class GroupVerdict:
    """Rank 0's decision for a generation: go (with the replacements it took in) or not (why)."""

    generation: int
    go: bool
    why: str = ""
    joiners: dict[int, int] = field(default_factory=dict)  # rank -> the replacement's announcement number
    members: list[int] = field(default_factory=list)  # the placement ranks of the generation (empty: every rank)

    def to_json(self) -> str:
        """As stored."""
        return json.dumps({"generation": self.generation, "go": self.go, "why": self.why,
                           "joiners": {str(k): v for k, v in self.joiners.items()}, "members": self.members})

    @classmethod
    def from_json(cls, text: str) -> GroupVerdict:
        """Inverse of ``to_json``."""
        data = json.loads(text)
        return cls(int(data["generation"]), bool(data["go"]), str(data.get("why", "")),
                   {int(k): int(v) for k, v in (data.get("joiners") or {}).items()},
                   [int(r) for r in data.get("members") or []])


class Membership:
    """This process's view of the group: its rank, the current generation, and the protocol to form the next.

    ``store`` is a client of the job's store (a torch ``Store``: set/get/add/check); ``names`` says how a
    rank is called in messages (its replica); ``timeout`` bounds every wait (``--timeout``).
    """

    def __init__(self, store: Any, run: str, rank: int, world_size: int, timeout: float,
                 names: Callable[[int], str] = str) -> None:
        self.store, self.rank, self.world_size, self.timeout, self.names = store, rank, world_size, timeout, names
        self.run, self.base = run, f"trainer/{run}/live/"
        self.generation = 0
        self.fingerprint: dict[str, Any] = {}
        self.shrink_by = 0  # ranks per replica when the survivors train on without a lost one (0: they wait for it)
        self.lost: Callable[[], set[int]] = set  # the ranks whose heartbeat stopped (rank 0 asks: ``_decide``)
        self.members: list[int] = list(range(world_size))  # the current generation's placement ranks

    @property
    def fewer(self) -> bool:
        """Whether the current generation trains without some of the placement's ranks."""
        return len(self.members) < self.world_size

    # ---- store helpers -------------------------------------------------------------------------------
    def _key(self, *parts: object) -> str:
        return self.base + "/".join(map(str, parts))

    def _get(self, *parts: object) -> str | None:
        key = self._key(*parts)
        return bytes(self.store.get(key)).decode() if self.store.check([key]) else None

    def _count(self, *parts: object) -> int:
        return int(self.store.add(self._key(*parts), 0))

    def pg_store(self, generation: int | None = None) -> Any:
        """The store a generation's process group meets in (a fresh prefix per generation)."""
        from torch.distributed import PrefixStore

        return PrefixStore(self._key(f"g{self.generation if generation is None else generation}", "pg"), self.store)

    # ---- generation 0 --------------------------------------------------------------------------------
    def joining(self) -> bool:
        """Whether this process replaces a lost one in a job that is already training (JobFinished: that ended)."""
        self._check_finished()
        return self._get("started") is not None

    def finish(self) -> None:
        """Rank 0: the training ended, nobody is taken in any more (a replacement still starting ends at once)."""
        if self.rank == 0:
            self.store.set(self._key("finished"), "1")

    def _check_finished(self) -> None:
        if self._get("finished") is not None:
            raise JobFinished("the job's training ended while this replacement was starting: nothing left to train "
                              "(the survivors finished with fewer replicas)")

    def started(self, fingerprint: dict[str, Any]) -> None:
        """The group trains (rank 0 marks it, so replacements know to join); every rank keeps its fingerprint."""
        self.fingerprint = fingerprint
        if self.rank == 0:
            self.store.set(self._key("started"), "1")

    # ---- a survivor ------------------------------------------------------------------------------------
    def reform(self, step: int, gone: set[int] | None = None) -> GroupVerdict:
        """After losing a peer: say so for the next generation, wait for rank 0's verdict (rank 0 decides it; ``gone``:
        the ranks whose heartbeat this process saw stop).

        Returns the verdict to go on with; raises PeerError (the checkpoint path) when there is none.
        """
        target = self.generation + 1
        self.store.set(self._key(f"g{target}", "here", self.rank), json.dumps({"step": step}))
        if self.rank == 0:
            verdict = self._decide(target, gone or set())
        else:
            verdict = self._await_verdict(target, "rank 0's decision on the group")
        if not verdict.go:
            raise PeerError(f"the group could not be re-formed: {verdict.why}; back to the newest checkpoint")
        members = verdict.members or list(range(self.world_size))
        if self.rank not in members:  # a node only partly here: its ranks left, the platform restarts it
            raise PeerError(f"this node lost a process, so the others trained on without {self.names(self.rank)} "
                            f"(rank {self.rank}): it restarts and joins them again")
        self.generation, self.members = target, members
        return verdict

    def _decide(self, target: int, gone: set[int]) -> GroupVerdict:
        """Rank 0: wait until every rank is a survivor or a fresh replacement, check the replacements, decide."""
        # the survivors say so within moments: name only who is really awaited
        wait = Wait(self.timeout, context="re-forming the group", first_after=2.0, logger=log)
        while True:
            joiners, missing, strangers = self._members(target)
            for rank, count in strangers.items():  # announced as a rank that is here: a replacement of another layout
                refused = self._refused(rank, count, target)
                if refused is not None:
                    return refused
            if not missing:
                members: list[int] = []
                break
            if self.shrink_by and not set(missing) <= gone and time.monotonic() - wait.started > 1.0:
                gone = self.lost()  # heartbeats that stopped (a few seconds' look): those are not coming
            if self.shrink_by and set(missing) <= gone:
                out = {r // self.shrink_by for r in missing}  # a node is whole or out
                members = [r for r in range(self.world_size) if r // self.shrink_by not in out]
                joiners = {r: n for r, n in joiners.items() if r in members}
                break
            why = "the platform restarts a lost replica in place"
            if wait.expired:
                return self._publish(GroupVerdict(target, False, wait.timed_out(self._named(missing), why)))
            wait.say(self._named(missing), why)
            wait.sleep(_POLL)
        for rank, count in joiners.items():
            refused = self._refused(rank, count, target)
            if refused is not None:
                return refused
        for rank, count in joiners.items():
            self.store.set(self._key("accepted", rank), str(count))
        self.store.set(self._key("gen"), str(target))
        return self._publish(GroupVerdict(target, True, joiners=joiners, members=members))

    def _refused(self, rank: int, count: int, target: int) -> GroupVerdict | None:
        """Rank 0: the ``count``-th replacement announced as ``rank`` refused (published) where its fingerprint
        differs from the group's (its node named as it names itself), else None."""
        theirs = json.loads(self._get("join", rank, count) or "{}")
        diff = differences(self.fingerprint, theirs)
        if not diff:
            return None
        why = f"the replacement of {theirs.get('replica') or self.names(rank)} was refused: it has {diff}"
        log.warning("%s; every replica goes back to the newest checkpoint", why)
        return self._publish(GroupVerdict(target, False, why))

    def ready(self) -> bool:
        """Rank 0, while a node is out: whether every rank of one left-out node announced its replacement."""
        out = [r for r in range(self.world_size) if r not in self.members]
        nodes: dict[int, list[bool]] = {}
        for rank in out:
            joins, accepted = self._count("joins", rank), int(self._get("accepted", rank) or 0)
            announced = joins > accepted and self.store.check([self._key("join", rank, joins)])
            nodes.setdefault(rank // max(self.shrink_by, 1), []).append(announced)
        return any(all(flags) for flags in nodes.values())

    def _members(self, target: int) -> tuple[dict[int, int], list[int], dict[int, int]]:
        """The fresh replacements (rank -> announcement), the ranks that are neither here nor replaced, and the
        replacements that announced themselves as a rank that is here (a node back with another number of
        processes: its ranks are not the ones it replaces)."""
        joiners: dict[int, int] = {}
        strangers: dict[int, int] = {}
        missing = []
        for rank in range(1, self.world_size):
            here = self.store.check([self._key(f"g{target}", "here", rank)])
            joins, accepted = self._count("joins", rank), int(self._get("accepted", rank) or 0)
            # a replacement counts itself in, then writes its fingerprint: it has joined once both are there
            announced = joins > accepted and self.store.check([self._key("join", rank, joins)])
            if here:
                strangers.update({rank: joins} if announced else {})
            elif announced:
                joiners[rank] = joins
            else:
                missing.append(rank)
        return joiners, missing, strangers

    def _publish(self, verdict: GroupVerdict) -> GroupVerdict:
        if not verdict.go:
            self.abandon()  # before the verdict: a refused replacement restarts only once it is set
        self.store.set(self._key(f"g{verdict.generation}", "verdict"), verdict.to_json())
        return verdict

    def abandon(self) -> None:
        """Any rank: the survivors give up recovering in place (the job goes back to its newest checkpoint); a node
        restarted from now on waits for the chief's next store instead of joining this attempt (``store.py``)."""
        with contextlib.suppress(Exception):  # the store may be gone already (the chief's process ended)
            self.store.set(abandoned_key(self.run), "1")

    def _await_verdict(self, target: int, what: str) -> GroupVerdict:
        # rank 0 decides within --timeout; a margin for it
        wait = Wait(self.timeout, margin=10, context="re-forming the group", first_after=LOG_EVERY, logger=log)
        wait.until(lambda: None if self._get(f"g{target}", "verdict") is not None else (what, ""))
        return GroupVerdict.from_json(self._get(f"g{target}", "verdict") or "")

    # ---- a replacement -----------------------------------------------------------------------------------
    def join(self, fingerprint: dict[str, Any]) -> GroupVerdict:
        """A replacement: announce itself with its fingerprint and wait to be taken into a generation."""
        self.fingerprint = fingerprint
        count = int(self.store.add(self._key("joins", self.rank), 1))
        self.store.set(self._key("join", self.rank, count), json.dumps(fingerprint))
        log.info("joining a job in progress as rank %d: waiting for the survivors to re-form the group", self.rank)
        wait = Wait(self.timeout, margin=10, context="joining a job in progress", first_after=LOG_EVERY, logger=log)
        while not wait.expired:
            self._check_finished()
            if self._get("started") is None:  # the store is a new one: the job went back to its checkpoint
                raise PeerError("not taken into the group: the job restarted from its newest checkpoint while this "
                                "replacement waited (its chief's store is a new one); it restarts with it")
            generation = int(self._get("gen") or 0)
            for candidate in (generation, generation + 1):
                text = self._get(f"g{candidate}", "verdict")
                if text is None:
                    continue
                verdict = GroupVerdict.from_json(text)
                if verdict.go and verdict.joiners.get(self.rank) == count:
                    self.generation, self.members = candidate, verdict.members or list(range(self.world_size))
                    return verdict
                if not verdict.go:  # the survivors go back to the checkpoint: so does this replacement
                    raise PeerError(f"not taken into the group: {verdict.why}")
            wait.say("the survivors to take this replacement in")
            wait.sleep(_POLL)
        raise wait.error("the survivors to take this replacement in")

    def _named(self, ranks: list[int]) -> str:
        return ", ".join(f"{self.names(r)} (rank {r})" for r in ranks)


def applies(plan: Any) -> bool:
    """Whether survivors keep training in this job: the PyTorch hooks loop across nodes, ``--recovery in-place``,
    processes placed by our launcher (not by the platform's own torchrun), a replicated model or HSDP (a live node
    holds a whole replica), or FSDP with ``--peer-snapshots on`` (a peer's memory holds each rank's shards; off: a
    model sharded over every rank restarts from its checkpoint, a lost rank takes its shards with it)."""
    topo, recovery = plan.topology, plan.options.framework_option("recovery", RECOVERY_DEFAULT)
    peers = plan.options.framework_option("peer_snapshots", PEER_SNAPSHOTS_DEFAULT) == "on"
    return bool(registry.get(plan.framework).survivors_regroup and recovery == "in-place" and topo.num_nodes >= 2
                and (plan.strategy != "fsdp" or peers)
                and topo.chief_host_port() is not None and not topo.processes_started_externally
                and plan.require_code().kind == "hooks")


def for_plan(plan: Any) -> Membership | None:
    """This training process's membership when survivors keep training applies to it, else None.

    It applies to the PyTorch hooks loop across nodes with ``--recovery in-place`` (the default) when our
    launcher placed the processes: the job's store is the chief node's TCPStore at the chief's address,
    which rank 0 hosts when it trains in the node's own process (else torch's agent there hosts it).
    """
    topo, options = plan.topology, plan.options
    address = topo.chief_host_port()
    if not applies(plan) or address is None:
        return None
    from torch.distributed import TCPStore

    host, port = address
    rank = plan.placed.training_rank
    hosts = rank == 0 and plan.nproc_per_node == 1
    store = TCPStore(host, port, None, hosts, timedelta(seconds=options.timeout), wait_for_workers=False,
                     multi_tenant=True)
    return Membership(store, job_run_id(host, port, topo.trial), rank, plan.placed.world_size,
                      options.timeout)
