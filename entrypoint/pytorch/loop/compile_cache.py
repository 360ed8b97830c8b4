"""``--compile``'s caches kept in the job dir, so a restart on a fresh disk does not compile everything again.

On the platform a restarted replica is a new container (``local`` gives it a fresh disk too), and
``torch.compile`` keeps what it compiled on the disk it leaves behind: the next attempt compiles every graph
again. With ``--compile``, the chief's training process keeps one archive in ``<job dir>/compile_cache/``
(through the storage seam: a disk, a FUSE mount or ``gs://``), written after its first step and again at the
first step of a later epoch when the caches grew (an evaluation's graphs): PyTorch's portable cache artifacts
(``torch.compiler.save_cache_artifacts``: FX graphs, AOTAutograd, autotuning, PGO) and the files this process
wrote to Inductor's cache directory or loaded into it (the compiled kernels: the C++ ``.so`` files on CPU,
Triton's under ``triton/`` on a GPU; and ``TRITON_CACHE_DIR``'s where it is set elsewhere). Every rank of every
later attempt loads it before its first step (``load``): the files into this disk's cache directories, the
artifacts with ``load_cache_artifacts``.

The archive is keyed by what makes it valid (``cache_key``): torch's, Triton's and Python's versions, the device
(kind, name and compute capability with CUDA's version on a GPU; the architecture and vector ISA on CPU) and a
digest of the model's code (the hooks module's file and every file defining a class of the model's modules,
torch's own excepted). The key names the file (``<digest>.tar.gz``, its key in ``<digest>.json`` beside it,
written last, and inside the archive), so an archive made for anything else is not read: one line says what
differs. A damaged archive is one line too. Neither is ever fatal: torch.compile compiles afresh and the chief
replaces the archive after its first step. torch's own cache keys still guard each graph inside it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import platform
import shutil
import tarfile
import tempfile
import time
from importlib import metadata
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import torch
from torch import nn

from entrypoint.cluster.environments.settings import triton_cache_dir
from entrypoint.outputs import checkpoints, storage
from entrypoint.outputs.locations import local_path
from entrypoint.outputs.storage import Location, RemotePath
from entrypoint.planning.plan import Plan
from entrypoint.pytorch.defaults import HookContext

log = logging.getLogger("entrypoint.pytorch")
FOLDER = "compile_cache"  # under the job dir
FORMAT = 1  # of the archive: part of the key
PORTABLE = "portable.bin"  # torch.compiler.save_cache_artifacts()'s bytes, in the archive
KEY = "key.json"  # in the archive, and beside it as ``<digest>.json``
ROOTS = ("inductor", "triton")  # the cache directories' files, under these names in the archive
MAX_FILES_BYTES = 1 << 30  # Inductor's and Triton's files archived at most (the portable artifacts always)
ISA_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
             "amx_bf16", "asimd", "sve", "sve2")  # /proc/cpuinfo flags that change the kernels Inductor builds


def cache_key(device: torch.device, model: nn.Module, module: ModuleType) -> dict[str, Any]:
    """What the caches are valid for: versions, the device, the model's code."""
    return {"format": FORMAT, "torch": torch.__version__, "triton": _version("triton", "pytorch-triton"),
            "python": f"{platform.python_implementation()} {platform.python_version()}",
            "device": device_kind(device), "model_code": code_digest(model, module)}


def _version(*names: str) -> str:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "none"


def device_kind(device: torch.device) -> str:
    """The device the kernels were built for: a GPU's name and compute capability, else the CPU's ISA."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"cuda {torch.cuda.get_device_name(device)} sm_{major}{minor} (CUDA {torch.version.cuda})"
    if device.type != "cpu":
        return device.type
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags.update(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return f"cpu {platform.machine()} ({' '.join(f for f in ISA_FLAGS if f in flags) or 'base ISA'})"


def code_digest(model: nn.Module, module: ModuleType) -> str:
    """A digest of the hooks module's file and of every file defining a class of the model's modules (torch's
    own are its version's)."""
    import inspect

    files = {getattr(module, "__file__", None)}
    classes = {cls for part in model.modules() for cls in type(part).__mro__}  # FSDP's subclasses: the user's too
    for cls in classes:
        if cls.__module__.split(".")[0] not in ("torch", "builtins"):
            try:
                files.add(inspect.getsourcefile(cls))
            except (TypeError, OSError):
                continue
    digests = sorted(hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files if f and os.path.isfile(f))
    return hashlib.sha256("".join(digests).encode()).hexdigest()[:16]


def digest_of(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def cache_dirs() -> dict[str, Path]:
    """This disk's cache directories: Inductor's (``TORCHINDUCTOR_CACHE_DIR``, else under the temp dir), and
    ``TRITON_CACHE_DIR`` where it is set outside it (else Triton's cache is Inductor's ``triton/``)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    dirs = {"inductor": Path(cache_dir())}
    triton = triton_cache_dir()
    if triton and not Path(triton).resolve().is_relative_to(dirs["inductor"].resolve()):
        dirs["triton"] = Path(triton)
    return dirs


def _files(dirs: dict[str, Path], since: float, loaded: frozenset[str]) -> dict[str, tuple[Path, int]]:
    """The cache files this process wrote (from ``since`` on) or loaded from the job's archive (archive name -> path,
    size): a cache directory the user keeps across jobs is not copied whole; lock files and partial writes left out."""
    found: dict[str, tuple[Path, int]] = {}
    for root, folder in dirs.items():
        for path in folder.rglob("*") if folder.is_dir() else ():
            name = f"{root}/{path.relative_to(folder).as_posix()}"
            if path.name.endswith((".lock", ".tmp")):  # locks/*.lock; partial writes
                continue
            try:
                stat = path.stat()
            except OSError:  # replaced meanwhile
                continue
            if path.is_file() and (stat.st_mtime >= since or name in loaded):
                found[name] = (path, stat.st_size)
    return found


class CompileCache:
    """The job's compile cache for this process: loaded before the first step, kept by the chief after it."""

    def __init__(self, folder: Location | None, key: dict[str, Any], chief: bool, speaks: bool) -> None:
        self.folder, self.key, self.chief, self.speaks = folder, key, chief, speaks
        self.digest = digest_of(key) if key else ""
        self.kept: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())  # (artifacts, files) held
        self.epoch: int | None = None  # the epoch of the last look at the caches
        self.since = time.time() - 2.0  # files written from here on are this process's (coarse mtimes allowed for)

    @classmethod
    def off(cls) -> CompileCache:
        return cls(None, {}, False, False)

    @property
    def on(self) -> bool:
        """``--compile`` is on (the layout compiles the model)."""
        return self.folder is not None

    @property
    def archive(self) -> Location:
        assert self.folder is not None
        return self.folder / f"{self.digest}.tar.gz"

    # ---- loading: every rank, before its first step ---------------------------------------------
    def load(self) -> None:
        """This job's archive into this disk's caches; anything else is one line, never fatal."""
        assert self.folder is not None
        started, doing = time.time(), "unreadable"
        try:
            if not (self.folder / f"{self.digest}.json").exists():
                self._say(self._absent())
                return
            data, doing = self.archive.read_bytes(), "damaged"
            loaded = self._unpack(data)
        except Exception as exc:  # the store, the archive, torch's loader: never fatal
            self._say(f"compile cache {self.archive} not used ({doing}: {type(exc).__name__}: {exc}); torch.compile "
                      "compiles afresh", logging.WARNING)
            return
        artifacts, files, size = loaded
        self._say(f"compile cache loaded from {self.archive} in {time.time() - started:.1f} s ({len(artifacts)} "
                  f"portable artifacts, {len(files)} kernel cache files, {size / 2**20:.1f} MiB): torch.compile "
                  "reuses what an earlier attempt compiled")

    def _absent(self) -> str:
        """Why there is nothing to load: no archive yet, or only ones made for something else (what differs)."""
        assert self.folder is not None
        others: list[Location] = list(self.folder.glob("*.json")) if self.folder.exists() else []
        for other in sorted(others, key=lambda p: p.name):
            try:
                theirs = json.loads(other.read_text())["key"]
            except (ValueError, KeyError, TypeError, OSError):
                continue
            differs = [f"{name} {theirs.get(name)!r} (here {mine!r})" for name, mine in self.key.items()
                       if theirs.get(name) != mine and name != "model_code"]
            if theirs.get("model_code") != self.key["model_code"]:
                differs.append("other model code")
            return (f"compile cache in {self.folder} not used: it was made for {'; '.join(differs) or 'another key'}; "
                    "torch.compile compiles afresh")
        return f"no compile cache in {self.folder} yet: torch.compile compiles afresh"

    def _unpack(self, data: bytes) -> tuple[frozenset[str], frozenset[str], int]:
        """The archive's files into the cache directories (each whole, what is there kept), then its artifacts."""
        dirs = cache_dirs()
        names: set[str] = set()
        portable = b""
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members = tar.getmembers()
            if members[0].name != KEY or json.loads(_read(tar, members[0])) != self.key:
                raise ValueError(f"its {KEY} is not this key's")
            for member in members[1:]:
                if member.name == PORTABLE:
                    portable = _read(tar, member)
                    continue
                root, _, rel = member.name.partition("/")
                parts = PurePosixPath(rel).parts
                if not member.isfile() or root not in ROOTS or not parts or ".." in parts or rel.startswith("/"):
                    raise ValueError(f"unexpected member {member.name!r}")
                if root in dirs and not (dirs[root] / rel).exists():  # triton/: where TRITON_CACHE_DIR is set
                    _put(dirs[root] / rel, _read(tar, member))
                names.add(member.name)
        quiet = logging.getLogger("torch.compiler._cache")  # its own warning and traceback: ours is the one line
        level, quiet.level = quiet.level, logging.ERROR
        try:
            info = torch.compiler.load_cache_artifacts(portable) if portable else None
        finally:
            quiet.setLevel(level)
        if portable and info is None:
            raise ValueError("torch could not read its portable artifacts")
        artifacts = frozenset(_artifact_names(info))
        self.kept = (artifacts, frozenset(names))
        return artifacts, frozenset(names), len(data)

    # ---- keeping: the chief, after its first step ---------------------------------------------
    def after_step(self, state: Any) -> None:
        """A step ended: after this process's first one, and at the first of each later epoch, the chief keeps
        the caches when they grew (a look costs a listing of the cache directories; the write, the seconds its
        log line says, once or twice an attempt)."""
        if not self.chief or self.folder is None or self.epoch == state.epoch:
            return
        self.epoch = state.epoch
        saved = torch.compiler.save_cache_artifacts()
        portable, info = saved if saved is not None else (b"", None)
        files = _files(cache_dirs(), self.since, self.kept[1])
        now = (frozenset(_artifact_names(info)), frozenset(files))
        if now[0] <= self.kept[0] and now[1] <= self.kept[1]:
            return
        if self._write(portable, files, state.step):
            self.kept = now

    def _write(self, portable: bytes, files: dict[str, tuple[Path, int]], step: int) -> bool:
        """The archive, then its key beside it (a reader that finds the key finds the archive whole); the
        archives of other keys go. A failure is one warning (False): the training goes on."""
        assert self.folder is not None
        started = time.time()
        try:
            with tempfile.TemporaryDirectory(prefix="trainer-compile-cache-") as scratch:
                packed = Path(scratch) / "cache.tar.gz"
                count, skipped = _pack(packed, self.key, portable, files)
                checkpoints.fenced()  # a job displaced from its job dir writes nothing more there
                self.folder.mkdir(parents=True, exist_ok=True)
                _copy(packed, self.archive)
                size = packed.stat().st_size
            marker = {"key": self.key, "step": step, "written_at": round(time.time(), 3), "bytes": size}
            (self.folder / f"{self.digest}.json").write_text(json.dumps(marker, indent=1, sort_keys=True) + "\n")
            for other in self.folder.iterdir():
                if not other.name.startswith((self.digest, ".")):
                    other.unlink(missing_ok=True)
        except Exception as exc:
            log.warning("compile cache not written to %s (%s: %s); the training goes on", self.folder,
                        type(exc).__name__, exc)
            return False
        log.info("compile cache written to %s after step %d in %.1f s (%d kernel cache files, %.1f MiB)%s",
                 self.archive, step, time.time() - started, count, size / 2**20,
                 f"; {skipped} files past {MAX_FILES_BYTES >> 20} MiB left out" if skipped else "")
        return True

    def _say(self, line: str, level: int = logging.INFO) -> None:
        log.log(level if self.speaks else logging.DEBUG, line)


def _artifact_names(info: Any) -> set[str]:
    """The keys of a ``CacheInfo``'s artifacts."""
    return {f"{kind}:{key}" for kind, keys in getattr(info, "artifacts", {}).items() for key in keys}


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(member)
    if handle is None:
        raise ValueError(f"unreadable member {member.name!r}")
    return handle.read()


def _put(target: Path, data: bytes) -> None:
    """``target`` written whole (a rank of the same node may be writing the same file)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    partial.write_bytes(data)
    os.replace(partial, target)


def _pack(target: Path, key: dict[str, Any], portable: bytes, files: dict[str, tuple[Path, int]]) -> tuple[int, int]:
    """The archive: its key first, the portable artifacts, the cache files (up to ``MAX_FILES_BYTES``)."""
    count = skipped = total = 0
    with tarfile.open(target, mode="w:gz", compresslevel=1) as tar:
        for name, data in ((KEY, json.dumps(key, sort_keys=True).encode()), (PORTABLE, portable)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, (path, size) in sorted(files.items()):
            if total + size > MAX_FILES_BYTES:
                skipped += 1
                continue
            try:
                tar.add(str(path), arcname=name, recursive=False)
            except OSError:  # removed meanwhile (Inductor replaces its files whole)
                continue
            count, total = count + 1, total + size
    return count, skipped


def _copy(source: Path, target: Location) -> None:
    """``source`` to ``target`` whole: on a disk under a hidden name renamed over it; on a store one upload."""
    if isinstance(target, RemotePath):
        with source.open("rb") as src, storage.failing_as_store(target), target.open("wb") as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
        return
    partial = target.with_name(f".{target.name}.partial")
    shutil.copyfile(source, partial)
    os.replace(partial, target)


def load(plan: Plan, ctx: HookContext, model: nn.Module, module: ModuleType) -> CompileCache:
    """With ``--compile``, the job's compile cache loaded into this process (every rank, before its first step);
    without it, a cache that does nothing."""
    if not plan.options.framework_option("compile", False):
        return CompileCache.off()
    folder = storage.path(local_path(plan.outputs.job_dir)) / FOLDER
    cache = CompileCache(folder, cache_key(ctx.device, model, module), ctx.is_chief, plan.placed.local_rank == 0)
    cache.load()
    return cache

