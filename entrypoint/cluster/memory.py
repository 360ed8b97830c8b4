"""The host memory this node can give, read without any ML framework, and whether copies of a job's state fit in it.

``available`` is the smaller of the host's ``MemAvailable`` (``/proc/meminfo``: free memory plus what the kernel can
reclaim) and the room left under the container's cgroup memory limit where one is set (cgroup v2 ``memory.max`` less
``memory.current``, v1 ``memory.limit_in_bytes`` less ``memory.usage_in_bytes``; the inactive page cache counts as
free, as the kubelet's working set counts it). FSDP's peer-memory snapshots (``pytorch/recovery/snapshots.py``) and
``doctor`` size themselves against it: the readers take the files' text or a root to read under, so tests fake both.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")  # a container's own cgroup (its namespace's root); v1 mounts memory/ under it
UNLIMITED_V1 = 1 << 62  # cgroup v1 writes "no limit" as the largest page-aligned 64-bit value (9223372036854771712)
# What the copies may take of what the node can give: the other half stays for what grows after the measurement
# (the checkpoint writer's host buffers, DataLoader workers, the page cache of the data).
MARGIN = 0.5
# A peer-memory snapshot's peak in host memory, in copies of one rank's shards and optimizer state (``snapshots.py``):
# its own two newest, its peer's newest (the one before is dropped as the next exchange starts), the serialized copy
# being sent and the bytes being received.
COPIES = 5
# Bytes of a snapshot per model parameter, over the ranks sharding it: fp32 parameters and Adam's two fp32 moments.
BYTES_PER_PARAMETER = 12


@dataclass(frozen=True)
class HostMemory:
    """What this node can give, and where the figure comes from."""

    available: int | None  # bytes; None: neither /proc/meminfo nor a cgroup limit could be read
    source: str  # "MemAvailable", "the cgroup v2 limit", ...

    def text(self) -> str:
        """``412.0 GiB available (MemAvailable)``."""
        if self.available is None:
            return "host memory unknown (no /proc/meminfo, no cgroup limit)"
        return f"{gib(self.available)} available ({self.source})"


UNKNOWN = HostMemory(None, "")


def gib(n: float) -> str:
    """Bytes in GiB, one decimal (``70.0 GiB``); under one, in MiB (``1.3 MiB``)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def meminfo_available(text: str) -> int | None:
    """``MemAvailable`` of /proc/meminfo's text, in bytes (None where the kernel does not give it)."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "MemAvailable":
            parts = value.split()
            if parts and parts[0].isdigit():
                return int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return None


def _read(path: Path) -> str | None:
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return path.read_text().strip()
    return None


def _stat(text: str | None, key: str) -> int:
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def cgroup_room(root: Path) -> tuple[int, str] | None:
    """Bytes left under the cgroup memory limit at ``root`` (v2 files there, else v1's under ``memory/``), and which;
    None where no limit is set or none can be read."""
    limit = _read(root / "memory.max")
    if limit is not None:
        used = _read(root / "memory.current")
        if limit == "max" or not limit.isdigit() or used is None or not used.isdigit():
            return None
        cache = _stat(_read(root / "memory.stat"), "inactive_file")
        return max(int(limit) - max(int(used) - cache, 0), 0), "the cgroup v2 limit"
    v1 = root / "memory"
    limit, used = _read(v1 / "memory.limit_in_bytes"), _read(v1 / "memory.usage_in_bytes")
    if limit is None or used is None or not limit.isdigit() or not used.isdigit() or int(limit) >= UNLIMITED_V1:
        return None
    cache = _stat(_read(v1 / "memory.stat"), "total_inactive_file")
    return max(int(limit) - max(int(used) - cache, 0), 0), "the cgroup v1 limit"


def available(meminfo: Path = MEMINFO, cgroup: Path = CGROUP) -> HostMemory:
    """What this node can give now: the host's MemAvailable, or the room under the container's limit if less."""
    host = meminfo_available(_read(meminfo) or "")
    room = cgroup_room(cgroup)
    if room is not None and (host is None or room[0] < host):
        return HostMemory(room[0], room[1])
    return HostMemory(host, "MemAvailable") if host is not None else UNKNOWN


@dataclass(frozen=True)
class NodeNeed:
    """One node's snapshots against what it can give."""

    node: str
    ranks: int  # its ranks that keep snapshots
    state: int  # bytes of their shards and optimizer state, summed
    need: int  # ``COPIES`` x ``state``
    available: int | None  # the least any of its ranks read (None: unknown)

    @property
    def fits(self) -> bool:
        """Within ``MARGIN`` of what it can give (unknown memory is not judged: it fits)."""
        return self.available is None or self.need <= MARGIN * self.available

    def text(self) -> str:
        """``node workerpool1-0: 2 ranks x 35.0 GiB of state x 5 copies = 350.0 GiB, 412.0 GiB available``."""
        given = gib(self.available) if self.available is not None else "unknown memory"
        return (f"{self.node}: {self.ranks} rank{'s' if self.ranks != 1 else ''} with {gib(self.state)} of shards "
                f"and optimizer state x {COPIES} copies = {gib(self.need)}, {given} available")


def node_needs(ranks: list[tuple[str, int, int | None]]) -> list[NodeNeed]:
    """Every node's need, from every rank's (node, bytes of its state, bytes its node can give), in node order."""
    nodes: dict[str, list[tuple[int, int | None]]] = {}
    for node, state, free in ranks:
        nodes.setdefault(node, []).append((state, free))
    found = []
    for node, views in nodes.items():
        state = sum(v[0] for v in views)
        known = [v[1] for v in views if v[1] is not None]
        found.append(NodeNeed(node, len(views), state, COPIES * state, min(known) if known else None))
    return found


def tightest(needs: list[NodeNeed]) -> NodeNeed:
    """The node whose copies take the most of what it can give (unknown memory last)."""
    return max(needs, key=lambda n: n.need / n.available if n.available else -1.0)


def short_node(needs: list[NodeNeed]) -> NodeNeed | None:
    """The node that can hold its copies least, if it cannot."""
    worst = tightest(needs)
    return None if worst.fits else worst


def parameters_that_fit(free: int, world: int, local: int) -> int:
    """The most model parameters whose snapshots (``BYTES_PER_PARAMETER`` sharded over ``world`` ranks, ``local`` of
    them here, ``COPIES`` each) fit within ``MARGIN`` of ``free`` bytes."""
    per_parameter = COPIES * BYTES_PER_PARAMETER * local / max(world, 1)
    return int(MARGIN * free / per_parameter) if per_parameter else 0
