"""What doctor's checks decide on, read from this node without importing any ML framework.

Reading is kept apart from deciding (``checks``), so the decisions are tested with made-up facts: a
64 MiB /dev/shm, a 535 driver under a CUDA 13 image, eight GPUs where four were planned.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import ipaddress
import os
import re
import resource
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from entrypoint.cluster import memory
from entrypoint.cluster.environments.settings import PlatformSettings, affinity_cpus
from entrypoint.cluster.gpus import driver_gpu_count
from entrypoint.errors import TrainerError
from entrypoint.outputs import checkpoints
from entrypoint.outputs.locations import local_path
from entrypoint.outputs.storage import StorageError, is_remote

SHM = Path("/dev/shm")
DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")
FORWARD_COMPAT_DIR = Path("/usr/local/cuda/compat")  # CUDA's forward-compatibility libraries, when installed
# The CUDA runtime wheel each framework build loads (CUDA 13 wheels dropped the -cuXX suffix).
CUDA_RUNTIME_WHEELS = ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu11")
UNLIMITED = -1
_DRIVER = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class Space:
    """A file system's size and what is free of it, in bytes."""

    total: int
    free: int


@dataclass(frozen=True)
class NodeFacts:
    """Facts about this node that do not depend on the plan."""

    shm: Space | None  # None: no /dev/shm at all
    driver: str | None  # the NVIDIA driver's version, None without one
    driver_gpus: int  # GPUs the driver lists (CUDA_VISIBLE_DEVICES aside)
    image_cuda: str | None  # the CUDA the frameworks here were built for ("13.0"); None: a CPU build
    forward_compat: bool  # the image ships CUDA's forward-compatibility libraries
    interfaces: tuple[str, ...]  # network interfaces, loopback included
    nofile: tuple[int, int]  # soft and hard open-file limits (UNLIMITED: -1)
    memlock: tuple[int, int]  # soft and hard locked-memory limits in bytes
    cpus: int  # the CPUs this process may run on (its affinity)
    host_memory: memory.HostMemory = memory.UNKNOWN  # what the host (or the container's limit) can give


@dataclass(frozen=True)
class PathFacts:
    """Where an output would go: the nearest existing directory and what it allows."""

    path: str
    existing: str | None  # the nearest existing ancestor (the path itself once created); None: not local
    writable: bool
    free: int | None  # bytes free on its file system


def space(path: Path) -> Space | None:
    """Size and free bytes of the file system at ``path`` (None if it does not exist)."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return Space(total=stat.f_blocks * stat.f_frsize, free=stat.f_bavail * stat.f_frsize)


def driver_version(text: str | None = None) -> str | None:
    """The NVIDIA driver's version from /proc (else ``nvidia-smi``), or None without a driver."""
    if text is None:
        with contextlib.suppress(OSError):
            text = DRIVER_VERSION_FILE.read_text()
    if text and (match := _DRIVER.search(text)):
        return match.group(1)
    smi = shutil.which("nvidia-smi")
    if text is None and smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        lines = out.stdout.split()
        return lines[0] if out.returncode == 0 and lines else None
    return None


def image_cuda(settings: PlatformSettings) -> str | None:
    """``major.minor`` of the CUDA runtime wheel the frameworks load, else of the base image's CUDA_VERSION."""
    for wheel in CUDA_RUNTIME_WHEELS:
        try:
            version = importlib.metadata.version(wheel)
        except importlib.metadata.PackageNotFoundError:
            continue
        return ".".join(version.split(".")[:2])
    if settings.cuda_version:
        return ".".join(settings.cuda_version.split(".")[:2])
    return None


def _limit(which: int) -> tuple[int, int]:
    soft, hard = resource.getrlimit(which)
    infinite = resource.RLIM_INFINITY
    return (UNLIMITED if soft == infinite else soft), (UNLIMITED if hard == infinite else hard)


def node_facts(settings: PlatformSettings) -> NodeFacts:
    """Read every plan-independent fact of this node (cheap: files, rlimits, package metadata)."""
    return NodeFacts(
        shm=space(SHM), driver=driver_version(), driver_gpus=driver_gpu_count(), image_cuda=image_cuda(settings),
        forward_compat=any(FORWARD_COMPAT_DIR.glob("libcuda.so*")),
        interfaces=tuple(name for _, name in socket.if_nameindex()),
        nofile=_limit(resource.RLIMIT_NOFILE), memlock=_limit(resource.RLIMIT_MEMLOCK), cpus=affinity_cpus(),
        host_memory=memory.available(),
    )


def path_facts(uri: str) -> PathFacts:
    """Whether an output location can be written, judged without leaving anything behind: where it does not exist
    yet, by creating (and removing) one empty directory where it would be created, as ``run`` will (a permission
    check alone passes root, whom ``/proc`` or a mount that takes no directories refuses all the same)."""
    if is_remote(local_path(uri)):
        return PathFacts(uri, None, False, None)  # an object store (gs:// without the FUSE mount): not checked here
    path = Path(local_path(uri))
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = space(probe)
    writable = probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)
    if writable and probe != path.absolute():
        writable = _can_create_in(probe)
    return PathFacts(uri, str(probe), writable, free.free if free else None)


def _can_create_in(directory: Path) -> bool:
    """Whether a directory can be created in ``directory`` (one is, and removed at once)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".doctor-probe-", dir=directory))
    except OSError:
        return False
    return True


def checkpoint_bytes(checkpoint_dir: str) -> int | None:
    """Size of the newest committed checkpoint whose files are the sizes its marker says, None without one.

    A marker whose sizes the files do not have (a corrupt manifest, a truncated file) is not trusted: resume
    skips that checkpoint, so its size says nothing about the next one (the files on disk do)."""
    try:
        found = checkpoints.committed(local_path(checkpoint_dir), warn=False)
        for _step, path in reversed(found):
            try:
                checkpoints.check_sizes(path)
            except (checkpoints.CheckpointError, OSError, ValueError, TypeError, AttributeError):
                continue
            files = checkpoints.read_marker(path).get("files") or {}
            return sum(int(f.get("size", 0)) for f in files.values()) or None
        return None
    except (OSError, ValueError, TypeError, AttributeError, TrainerError, StorageError):
        return None  # unknown: the run itself reports a store it cannot reach


def host_of(address: str) -> str:
    """The host part of ``host:port`` (IPv6 brackets removed)."""
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 or address.startswith("[") else address
    return host.strip("[]")


def _resolves(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    try:
        return bool(socket.getaddrinfo(host, None))
    except (OSError, UnicodeError):
        return False


def resolvable(hosts: list[str], timeout: float = 2.0) -> dict[str, bool | None]:
    """Whether each host name resolves now (None: no answer within ``timeout`` seconds)."""
    found: dict[str, bool | None] = {}
    threads = []
    for host in sorted(set(hosts)):
        found[host] = None

        def look(name: str = host) -> None:
            found[name] = _resolves(name)

        thread = threading.Thread(target=look, daemon=True)  # a resolver that hangs must not hold the exit
        thread.start()
        threads.append(thread)
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return dict(found)
