"""The container engine of the local builds: docker where `docker info` works, else podman
(CONTAINER_ENGINE=docker|podman forces one), with the flags that make builds and runs work here."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from build_common import INSTALL, Failure, log

# Inside containers: explicit limits (podman's defaults raise them and fail with "setrlimit ... not permitted").
NPROC = 4096
NOFILE_MAX = 65536  # or the host's hard limit, if lower


@dataclass(frozen=True)
class Engine:
    """A working docker or podman, with the flags that make builds and runs work on this kind of machine."""

    name: str
    argv: tuple[str, ...]

    def command(self, *args: str) -> list[str]:
        return [*self.argv, *args]

    def output(self, *args: str, timeout: float = 120) -> str:
        """Run an engine command and return its stdout; a failure raises Failure."""
        proc = subprocess.run(self.command(*args), capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise Failure(f"`{self.name} {' '.join(args[:2])}` failed (exit {proc.returncode}): {detail}")
        return proc.stdout

    def exists(self, ref: str) -> bool:
        return self.image_id(ref) is not None

    def image_id(self, ref: str) -> str | None:
        """The image ``ref`` names, or None when there is none."""
        proc = subprocess.run(self.command("image", "inspect", "--format", "{{.Id}}", ref), capture_output=True,
                              text=True, check=False)
        return (proc.stdout.strip() or None) if proc.returncode == 0 else None

    def remove_replaced(self, ref: str, old: str | None) -> None:
        """Remove the image ``ref`` named before a build, once the build gave the name to a new one: each `make test`
        otherwise leaves a GB-sized untagged image behind and, run after run, fills the disk. Not forced: an image a
        container still uses stays."""
        if old is not None and old != self.image_id(ref):
            subprocess.run(self.command("rmi", old), capture_output=True, check=False)

    def limits(self) -> list[str]:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nofile = NOFILE_MAX if nofile == resource.RLIM_INFINITY else min(nofile, NOFILE_MAX)
        return ["--ulimit", f"nproc={NPROC}:{NPROC}", "--ulimit", f"nofile={nofile}:{nofile}"]

    def build_flags(self) -> list[str]:
        """Host network (the local wheel index is on 127.0.0.1) and, for podman, Docker's image format
        (in the OCI format the Dockerfiles' SHELL lines are ignored, so pipefail would silently not apply)
        and the host's CA bundle for pip (never stored in a layer)."""
        flags = ["--network", "host", *self.limits()]
        if self.name == "podman":
            flags += ["--format", "docker"]
            bundle = Path("/etc/ssl/certs/ca-certificates.crt")
            if bundle.is_file():
                flags += ["--volume", f"{bundle}:{bundle}:ro"]
        return flags

    def run_flags(self) -> list[str]:
        """Every test container: host network (CLUSTER_SPEC names 127.0.0.1 ports), low limits."""
        return ["--network", "host", *self.limits()]


def _podman_argv() -> tuple[str, ...]:
    # cgroupfs: no systemd here; runc: crun fails with "cgroups in hybrid mode not supported".
    argv = ("podman", "--cgroup-manager", "cgroupfs")
    return (*argv, "--runtime", "runc") if shutil.which("runc") else argv


def _wanted() -> str:
    wanted = os.environ.get("CONTAINER_ENGINE", "")
    if wanted not in ("", "docker", "podman"):
        raise Failure(f"CONTAINER_ENGINE={wanted!r} is not an engine this script drives: use docker or podman")
    return wanted


def _broken(argv: Sequence[str], patience: float = 60) -> str | None:
    """None when ``argv info`` works, else why not (its last line of output). ``info`` waits for the storage
    lock that a build beside it holds while it commits a layer: ``patience`` is how long that may take."""
    if not shutil.which(argv[0]):
        return "not installed"
    try:
        proc = subprocess.run([*argv, "info"], capture_output=True, text=True, timeout=patience, check=False)
    except subprocess.TimeoutExpired:
        return f"`info` did not answer in {patience:.0f} s"
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["`info` failed"])[-1]


def find_engine(patience: float = 60) -> tuple[Engine | None, list[str]]:
    """Docker where `docker info` works, else podman where it works (CONTAINER_ENGINE picks one), and
    why each engine passed over was; ``patience``: see _broken."""
    wanted, reasons = _wanted(), list[str]()
    for name, argv in (("docker", ("docker",)), ("podman", _podman_argv())):
        if wanted in ("", name):
            why = _broken(argv, patience)
            if why is None:
                return Engine(name, argv), reasons
            reasons.append(f"{name}: {why}")
    return None, reasons


def detect_engine(patience: float = 60) -> Engine | None:
    return find_engine(patience)[0]


def install_engine() -> None:
    """apt-get install podman, runc and mmdebstrap (root on a Debian-like system without podman)."""
    log(f"no container engine: running {INSTALL}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], [*INSTALL.split(), "-qq"]):
        if subprocess.run(argv, env=env, check=False).returncode != 0:
            raise Failure(f"`{' '.join(argv)}` failed: install podman, runc and mmdebstrap by hand, then rerun")


def require_engine(install: bool = False) -> Engine:
    """The engine, installing podman first where that is possible and ``install`` says so."""
    engine, reasons = find_engine()
    if (engine is None and install and os.geteuid() == 0 and shutil.which("apt-get")
            and not shutil.which("podman") and _wanted() in ("", "podman")):
        install_engine()
        engine, reasons = find_engine()
    if engine is None:
        raise Failure(f"no working container engine ({'; '.join(reasons)}): {INSTALL}, or start Docker")
    return engine
