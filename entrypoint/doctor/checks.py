"""Doctor's decisions: facts in, one finding per check out (no I/O here, so tests fake every fact).

A finding is ``ok``, ``warning`` (with the fix), ``error`` (only for what will certainly fail, with the fix
and the failure class it ends ``run`` with) or ``skipped`` (not applicable here). Sources for every
threshold are in docs/operations.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from entrypoint import errors
from entrypoint.cluster import memory
from entrypoint.doctor.facts import UNLIMITED, PathFacts, Space
from entrypoint.errors import FailureClass
from entrypoint.outputs.sbom import ImageIdentity
from entrypoint.planning import registry

Status = Literal["ok", "warning", "error", "skipped"]
MIB = 1 << 20
GIB = 1 << 30
# One DataLoader worker keeps prefetch_factor (2) batches in /dev/shm: room for two of up to 32 MiB each.
SHM_PER_WORKER = 64 * MIB
NCCL_SHM = GIB  # NCCL's troubleshooting guide asks containers for --shm-size=1g
MIN_NOFILE = 4096
MIN_MEMLOCK = 64 * MIB
MIN_FREE_DISK = GIB  # before the first checkpoint tells its size
# CUDA minor-version compatibility: the oldest driver each CUDA major runs on.
MIN_DRIVER = {13: (580,), 12: (525,), 11: (450,)}
# ``--strategy fsdp`` on a node that cannot hold the peer-memory snapshots of a model this large: a warning (a model
# worth sharding is rarely smaller).
MIN_SNAPSHOT_PARAMETERS = 10**9
FIX_SNAPSHOTS = ("--peer-snapshots off (a lost node restarts the job from storage), or more host memory for the "
                 "container")
FIX_SHM = ("docker run --shm-size=1g (or --ipc=host); on Kubernetes mount an emptyDir with medium: Memory "
           "at /dev/shm")


@dataclass(frozen=True)
class Finding:
    """One check's verdict: one line for people, one object for machines."""

    check: str
    status: Status
    message: str
    fix: str | None = None
    failure: FailureClass = errors.CONFIG  # what an error ends ``run`` with (docs/EXIT_CODES.md)

    def text(self) -> str:
        """``check: message; fix: ...``."""
        return f"{self.check}: {self.message}" + (f"; fix: {self.fix}" if self.fix else "")

    def line(self) -> str:
        """The line ``doctor`` prints: status, check, message and fix."""
        return f"{self.status:<8}{self.text()}"

    def to_dict(self) -> dict[str, Any]:
        """The object ``doctor --json`` lists."""
        found: dict[str, Any] = {"check": self.check, "status": self.status, "message": self.message, "fix": self.fix}
        if self.status == "error":
            found.update({"class": self.failure.name, "exit_code": int(self.failure.exit_code)})
        return found


def size(n: int) -> str:
    """Bytes as people read them: ``64 MiB``, ``1.5 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def count(n: int, word: str, plural: str | None = None) -> str:
    """``1 process``, ``2 processes``."""
    return f"{n} {word if n == 1 else plural or word + 's'}"


def version_tuple(version: str) -> tuple[int, ...]:
    """``580.65.06`` -> (580, 65, 6); junk parts count as 0."""
    return tuple(int(part) if part.isdigit() else 0 for part in version.split("."))


# ---- /dev/shm -----------------------------------------------------------------------------------
def shm(found: Space | None, nproc: int, workers: int, cappable: bool, nccl: bool) -> tuple[Finding, int | None]:
    """/dev/shm against DataLoader workers (and NCCL); the capped worker count when the loop is ours."""
    demand = f"{count(nproc, 'process', 'processes')} x {count(workers, 'DataLoader worker')}"
    need = nproc * workers * SHM_PER_WORKER + (NCCL_SHM if nccl else 0)
    if nccl:
        demand += " and NCCL between GPUs"
    if found is None:
        cap = 0 if cappable and workers else None
        what = " (run starts no DataLoader workers)" if cap == 0 else ""
        return Finding("shm", "warning", f"no /dev/shm here: {demand} need it{what}", FIX_SHM), cap
    if need <= found.free:
        return Finding("shm", "ok", f"/dev/shm {size(found.free)} free; {demand} need about {size(need)}"), None
    docker = " (Docker's default)" if found.total == 64 * MIB else ""
    message = f"/dev/shm has {size(found.free)} free of {size(found.total)}{docker}; {demand} need about {size(need)}"
    if not cappable or workers == 0:
        what = "DataLoader workers may die with 'Bus error'" if workers else "NCCL may fail to start"
        return Finding("shm", "warning", f"{message}: {what}", FIX_SHM), None
    room = max(0, found.free - (NCCL_SHM if nccl else 0))
    cap = min(workers, room // (nproc * SHM_PER_WORKER))
    return Finding("shm", "warning", f"{message}: run caps --data-workers at {cap} (was {workers})", FIX_SHM), cap


# ---- driver and GPUs -----------------------------------------------------------------------------
def driver(version: str | None, image_cuda: str | None, forward_compat: bool, driver_gpus: int) -> Finding:
    """The NVIDIA driver against the CUDA this image's frameworks were built for."""
    if image_cuda is None:
        if driver_gpus:
            return Finding("driver", "warning", f"a CPU build of the framework: {driver_gpus} GPU(s) stay unused",
                           "use the GPU image (the -cpu tag is for machines without GPUs)")
        return Finding("driver", "skipped", "a CPU build and no GPU")
    if version is None:
        return Finding("driver", "warning" if driver_gpus else "skipped",
                       f"no NVIDIA driver: this CUDA {image_cuda} image trains on CPU",
                       "docker run --gpus all (or request GPUs for the pod)" if driver_gpus else None)
    major = version_tuple(image_cuda)[0]
    minimum = MIN_DRIVER.get(major)
    if minimum is None:
        return Finding("driver", "ok", f"driver {version}; CUDA {image_cuda} (no minimum known)")
    needed = ".".join(map(str, minimum))
    if version_tuple(version) >= minimum:
        return Finding("driver", "ok", f"driver {version} runs CUDA {image_cuda} (needs {needed} or newer)")
    message = (f"driver {version} is older than CUDA {image_cuda} needs ({needed} or newer): CUDA would fail with "
               "'CUDA driver version is insufficient for CUDA runtime version'")
    fix = f"a node with driver {needed}+ (on GKE a newer node version or gpu-driver-version=latest)" + \
        "".join(f", or the CUDA {cuda} {title} image, which runs on {'.'.join(map(str, MIN_DRIVER[cuda]))}+"
                for cuda, title in _older_images(major))
    if forward_compat:
        return Finding("driver", "warning", message + "; this image ships CUDA's forward-compatibility libraries, "
                       "which only data-center GPUs can use", fix)
    return Finding("driver", "error", message, fix)


def usable_gpus(planned: int, driver_gpus: int) -> int:
    """GPUs training will use: those planned (CUDA_VISIBLE_DEVICES, else all), as far as the driver has them."""
    return min(planned, driver_gpus)


def gpus(framework: str, nproc: int, planned: int, driver_gpus: int, image_cuda: str | None,
         forced: bool) -> Finding:
    """The GPUs this node has against the processes the plan starts on it."""
    if image_cuda is None:
        return Finding("gpus", "skipped", f"a CPU build: {count(nproc, 'process', 'processes')} on CPU")
    if driver_gpus == 0:
        if planned:
            return Finding("gpus", "warning", f"CUDA_VISIBLE_DEVICES names {planned} GPU(s) but no NVIDIA driver is "
                           "loaded: training runs on CPU", "docker run --gpus all (or request GPUs for the pod)")
        return Finding("gpus", "skipped", f"no GPU: {count(nproc, 'process', 'processes')} on CPU")
    usable = usable_gpus(planned, driver_gpus)
    listed = count(usable, "usable GPU") + (f" of {driver_gpus}" if usable != driver_gpus else "")
    if registry.get(framework).gpus_per_process == "all":
        return Finding("gpus", "ok", f"{listed}, driven by one {registry.get(framework).label} process")
    if usable and nproc > usable:
        return Finding("gpus", "error", f"{nproc} processes planned on this node but {listed}: a process without its "
                       "own GPU fails with 'invalid device ordinal'",
                       f"--nproc-per-node {usable} (or fewer), or give the node more GPUs")
    if forced and nproc < usable:
        return Finding("gpus", "warning", f"{count(nproc, 'process', 'processes')} for {listed}: "
                       f"{usable - nproc} stay idle",
                       "leave out --nproc-per-node (one process per GPU)")
    processes = count(nproc, "process", "processes")
    return Finding("gpus", "ok", f"{listed}, {processes}, one GPU each" if usable else
                   f"CUDA_VISIBLE_DEVICES hides every GPU: {processes} on CPU")


def cpus(given: int | None, usable: int) -> Finding:
    """TRAINER_CPUS (the CPUs the replica's processes size their thread pools from) against this process's
    affinity: more is accepted, and warned about (more threads than CPUs spin against each other)."""
    if given is None:
        return Finding("cpus", "ok", f"{count(usable, 'CPU')} to run on (TRAINER_CPUS not set)")
    if given > usable:
        return Finding("cpus", "warning", f"TRAINER_CPUS={given} but this process may run on {count(usable, 'CPU')}:"
                       " thread pools sized from it oversubscribe the CPUs",
                       f"TRAINER_CPUS={usable} or fewer (or leave it unset)")
    return Finding("cpus", "ok", f"TRAINER_CPUS={given} of the {count(usable, 'CPU')} to run on")


# ---- network interfaces and limits ----------------------------------------------------------------
def nccl_matches(spec: str, interfaces: tuple[str, ...]) -> list[str]:
    """Interfaces NCCL_SOCKET_IFNAME selects: prefixes, ``=`` exact names, ``^`` to exclude (NCCL's rules)."""
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    exact = body.startswith("=")
    names = [n for n in (body[1:] if exact else body).split(",") if n]

    def hit(iface: str) -> bool:
        return any(iface == n if exact else iface.startswith(n) for n in names)

    return [i for i in interfaces if hit(i) != exclude]


def interfaces(nccl_spec: str | None, gloo_spec: str | None, found: tuple[str, ...], nccl: bool,
               gloo: bool) -> Finding:
    """The socket interface NCCL / gloo were told to use exists on this node."""
    if not (nccl or gloo):
        return Finding("network", "skipped", "no NCCL or gloo between processes here")
    problems, chosen = [], []
    if nccl and nccl_spec:
        matched = nccl_matches(nccl_spec, found)
        chosen.append(f"NCCL_SOCKET_IFNAME={nccl_spec} selects {', '.join(matched) or 'nothing'}")
        if not matched:
            problems.append(f"NCCL_SOCKET_IFNAME={nccl_spec} matches none of {', '.join(found)}")
    if gloo and gloo_spec:
        missing = [n for n in gloo_spec.split(",") if n and n not in found]
        chosen.append(f"GLOO_SOCKET_IFNAME={gloo_spec}")
        if missing:
            problems.append(f"GLOO_SOCKET_IFNAME names {', '.join(missing)}, not among {', '.join(found)}")
    if problems:
        return Finding("network", "error", "; ".join(problems) + ": the process group cannot start",
                       "unset it or name an interface listed by `ip -brief link`")
    backends = " and ".join(b for b, used in (("NCCL", nccl), ("gloo", gloo)) if used)
    return Finding("network", "ok", "; ".join(chosen) if chosen else
                   f"{backends} {'choose' if nccl and gloo else 'chooses'} among {', '.join(found)}")


def _limit_text(value: int, in_bytes: bool = False) -> str:
    return "unlimited" if value == UNLIMITED else size(value) if in_bytes else str(value)


def nofile(limits: tuple[int, int], workers: int) -> Finding:
    """Open files: DataLoader workers hand batches over as file descriptors."""
    soft, hard = limits
    if workers and soft != UNLIMITED and soft < MIN_NOFILE:
        return Finding("nofile", "warning", f"open-file limit {soft} (hard {_limit_text(hard)}) is low for "
                       f"{count(workers, 'DataLoader worker')}: 'Too many open files' is likely",
                       "docker run --ulimit nofile=65536:65536 (or raise the pod's limit)")
    return Finding("nofile", "ok", f"open-file limit {_limit_text(soft)}")


def memlock(limits: tuple[int, int], nccl: bool) -> Finding:
    """Locked memory: NCCL pins host memory (its docs ask containers for memlock=-1)."""
    soft, _hard = limits
    if not nccl:
        return Finding("memlock", "skipped", f"locked-memory limit {_limit_text(soft, True)}; no NCCL here")
    if soft != UNLIMITED and soft < MIN_MEMLOCK:
        return Finding("memlock", "warning", f"locked-memory limit {size(soft)} is low for NCCL",
                       "docker run --ulimit memlock=-1")
    return Finding("memlock", "ok", f"locked-memory limit {_limit_text(soft, True)}")


# ---- FSDP's snapshots in peer memory --------------------------------------------------------------
def peer_snapshots(kind: str | None, found: memory.HostMemory, world: int, local: int) -> Finding:
    """The host memory FSDP's peer-memory snapshots will take per model parameter on this node (the model's size is
    known only once it is built: the run's guard decides at the first commit) against what the node can give."""
    if kind is None:
        return Finding("peer snapshots", "skipped", "no FSDP across nodes with --peer-snapshots on in this plan")
    if found.available is None:
        return Finding("peer snapshots", "warning", f"{found.text()}: the run cannot check that FSDP's snapshots in "
                       "peer memory fit (they are taken unchecked)", FIX_SNAPSHOTS)
    per = memory.COPIES * memory.BYTES_PER_PARAMETER * local / max(world, 1)
    most = memory.parameters_that_fit(found.available, world, local)
    when = " (where FSDP is chosen by the model's size)" if kind == "fsdp by size" else ""
    message = (f"{found.text()}; FSDP's snapshots in peer memory{when} take {memory.COPIES} copies x "
               f"{memory.BYTES_PER_PARAMETER} bytes per parameter (fp32 weights and Adam state) / {world} ranks x "
               f"{count(local, 'rank')} here = {per:.3g} bytes per model parameter: a model of up to "
               f"{most / 1e9:.1f} B parameters fits in {memory.MARGIN:.0%} of it (larger: the run turns them off)")
    if most < MIN_SNAPSHOT_PARAMETERS and kind == "fsdp":  # by size: a model too large for DDP, whose size comes later
        return Finding("peer snapshots", "warning", message, FIX_SNAPSHOTS)
    return Finding("peer snapshots", "ok", message)


# ---- outputs, disk, peers --------------------------------------------------------------------------
def outputs(places: list[tuple[str, PathFacts]], chief: bool) -> Finding:
    """Every output location can be written (the chief writes them; the others only failure records)."""
    unchecked = [f"{name} {p.path}" for name, p in places if p.existing is None]
    for name, place in places:
        if place.existing is not None and not place.writable:
            where = place.path if place.existing == place.path else f"{place.path} (nearest existing: {place.existing})"
            if not chief:
                return Finding("outputs", "warning", f"{name} {where} is not writable here: failure records go to "
                               "the temp dir instead", "mount the job dir writable for uid "
                               "1000 on every replica")
            return Finding("outputs", "error", f"{name} {where} is read-only or not writable",
                           "mount it writable for the trainer user (uid 1000), or point --job-dir elsewhere",
                           errors.OUTPUT_NOT_WRITABLE)
    if len(unchecked) == len(places):
        return Finding("outputs", "skipped", f"Cloud Storage outputs, no /gcs mount here: {', '.join(unchecked)}")
    names = ", ".join(name for name, p in places if p.existing is not None)
    note = f" ({', '.join(unchecked)}: not checked, no /gcs mount here)" if unchecked else ""
    return Finding("outputs", "ok", f"{names} writable{note}")


def disk(free: int | None, checkpoint: int | None, where: str) -> Finding:
    """Free space where checkpoints go: room for at least two (sized by the newest committed one)."""
    if free is None:
        return Finding("disk", "skipped", f"{where}: not a local file system")
    if checkpoint is None:
        if free < MIN_FREE_DISK:
            return Finding("disk", "warning", f"only {size(free)} free for {where} (checkpoint size unknown until the "
                           "first one)", "free space or mount a larger volume")
        return Finding("disk", "ok", f"{size(free)} free for {where}")
    room = free // checkpoint
    message = f"{size(free)} free for {where}; the newest checkpoint is {size(checkpoint)}"
    if room < 1:
        return Finding("disk", "error", f"{message}: the next one cannot be written",
                       "free space, keep fewer checkpoints (--keep-checkpoints) or mount a larger volume",
                       errors.DISK_FULL)
    if room < 2:
        return Finding("disk", "warning", f"{message}: room for one more only",
                       "free space or mount a larger volume")
    return Finding("disk", "ok", f"{message}: room for {room} more")


def peers(resolved: dict[str, bool | None]) -> Finding:
    """Every peer's host name resolves (a new pod's DNS record can lag: a warning, the barrier waits)."""
    if not resolved:
        return Finding("peers", "skipped", "no peers to reach (one node, or addresses come later)")
    bad = [host for host, ok in resolved.items() if not ok]
    if bad:
        what = "no answer from DNS yet" if all(resolved[h] is None for h in bad) else "not resolvable yet"
        return Finding("peers", "warning", f"{what}: {', '.join(bad)}; the start-up barrier waits --timeout "
                       "(exit 196 if a name never resolves)", "check the peers' service / host names and DNS")
    return Finding("peers", "ok", f"{count(len(resolved), 'peer host')} resolve")


def framework(name: str, version: str | None, here: tuple[str, ...], where: str, script: bool) -> Finding:
    """The job's framework in this Python (found, never imported): what ``run`` refuses before anything runs (a
    hooks or module job), or runs with a warning (a script may need nothing of it)."""
    if version is not None:
        return Finding("framework", "ok", " ".join(filter(None, (name, version, "installed in this Python"))))
    message = f"{name} is not installed in this Python (installed here: {', '.join(here) or 'none'})"
    if script:
        return Finding("framework", "warning", f"{message}; the script runs as it is", fix=where)
    return Finding("framework", "error", message, fix=where)


def image(identity: ImageIdentity) -> Finding:
    """The image this node runs: the digest its job's spec pinned (TRAINER_IMAGE) and its bill of materials' hash.
    Never a warning: a job by tag, or an image without a bill of materials, runs; the line says what is known."""
    known = bool(identity.digest or identity.sbom_sha256)
    return Finding("image", "ok" if known else "skipped", identity.text())


def _older_images(major: int) -> list[tuple[int, str]]:
    """Our GPU images built on an older CUDA major than ``major`` (a way to an older driver), from the registry."""
    found = {(f.cuda_major, f.label) for f in map(registry.get, registry.names())
             if f.cuda_major is not None and f.cuda_major < major and f.cuda_major in MIN_DRIVER}
    return sorted(found, reverse=True)
