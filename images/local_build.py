#!/usr/bin/env python3
"""Build the CPU variant of every trainer image on this machine from the real Dockerfiles (make image-test).

Only build arguments differ from the release build of cloudbuild.yaml: the base (a Debian bookworm root
file system made here with mmdebstrap, because no registry can be pulled from), its Python (3.11), and
where two wheels come from: torch's +cpu wheel (the host's pip find-links directory, served as a local
index) and Horovod's (the host's wheel cache, which `make venv-horovod` fills, served so that the image
build takes a wheel built for exactly its key instead of compiling Horovod a second time).

    python3 images/local_build.py engine [--install]   # which engine would be used (podman is installed if root)
    python3 images/local_build.py base                 # localhost/debian:bookworm, made once, refreshed monthly
    python3 images/local_build.py build [IMAGE ...]    # localhost/trainer-<image>:cpu, then the size report
    python3 images/local_build.py sizes                # size, 5 largest layers and budget of each image
    python3 images/local_build.py clean                # the images, the base and every layer built on it

Docker is used where `docker info` works, otherwise podman (CONTAINER_ENGINE=docker|podman forces one).
Every failure ends in one line saying what failed and what to do, and a non-zero exit.
Standard library only: the container tests (tests/containers/) import this file for the same settings.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.server
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ("pytorch", "tensorflow", "horovod")
BUDGET_FILE = ROOT / "images" / "size-budget.json"
INSTALL = "apt-get install -y podman runc mmdebstrap"
EXIT_NO_ENGINE = 3  # `engine` without an engine and outside CI: the caller skips the image tests

# The local base: what mmdebstrap makes, and how long it is trusted before a refresh (security updates).
BASE_REF = "localhost/debian:bookworm"
BASE_PYTHON = "3.11"  # bookworm's python3.11 (the release base, Ubuntu 24.04, has 3.12)
BASE_SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
BASE_RECIPE = ("mmdebstrap", "--variant=minbase", "--include=ca-certificates", "bookworm")
BASE_MAX_AGE_DAYS = 30
BASE_LABEL = "org.trainer-images.base"  # "<recipe hash>-<UTC stamp>"; every image built on the base inherits it

# Inside containers: explicit limits (podman's defaults raise them and fail with "setrlimit ... not permitted").
NPROC = 4096
NOFILE_MAX = 65536  # or the host's hard limit, if lower
# The local wheel index is a build argument: a fixed port keeps it, and so the layer cache, the same.
WHEEL_PORT = int(os.environ.get("TRAINER_WHEEL_PORT", "38417"))
# images/horovod/build_horovod_wheel.sh's cache: <key>/key.txt and <key>/horovod-*.whl per build key.
HOROVOD_CACHE_PATH = "horovod"  # where the index serves it


class Failure(Exception):
    """Something failed: the message says what, and what to do (one line)."""


def log(message: str) -> None:
    print(f"local_build: {message}", flush=True)


def is_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def image_ref(image: str) -> str:
    """The local tag of an image's CPU variant."""
    return f"localhost/trainer-{image}:cpu"


# ---- the container engine ------------------------------------------------------------------------

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
        return subprocess.run(self.command("image", "inspect", ref), capture_output=True, check=False).returncode == 0

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


def _broken(argv: Sequence[str]) -> str | None:
    """None when ``argv info`` works, else why not (its last line of output)."""
    if not shutil.which(argv[0]):
        return "not installed"
    try:
        proc = subprocess.run([*argv, "info"], capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return "`info` timed out"
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["`info` failed"])[-1]


def find_engine() -> tuple[Engine | None, list[str]]:
    """Docker where `docker info` works, else podman where it works (CONTAINER_ENGINE picks one), and
    why each engine passed over was."""
    wanted, reasons = _wanted(), list[str]()
    for name, argv in (("docker", ("docker",)), ("podman", _podman_argv())):
        if wanted in ("", name):
            why = _broken(argv)
            if why is None:
                return Engine(name, argv), reasons
            reasons.append(f"{name}: {why}")
    return None, reasons


def detect_engine() -> Engine | None:
    return find_engine()[0]


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


# ---- the local base ------------------------------------------------------------------------------

def _recipe_hash() -> str:
    return hashlib.sha256("\n".join(BASE_RECIPE + BASE_SOURCES).encode()).hexdigest()[:12]


def base_label(engine: Engine) -> str | None:
    """The base image's label (recipe hash and stamp), or None when there is no base."""
    if not engine.exists(BASE_REF):
        return None
    label = engine.output("image", "inspect", "--format", f'{{{{index .Config.Labels "{BASE_LABEL}"}}}}', BASE_REF)
    return label.strip() or "unlabelled"


def _base_age_days(label: str) -> float | None:
    match = re.fullmatch(r"[0-9a-f]{12}-(\d{8}T\d{6}Z)", label)
    if not match:
        return None
    made = datetime.strptime(match.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    return (datetime.now(timezone.utc) - made).total_seconds() / 86400


def base_is_current(label: str | None) -> bool:
    if label is None or not label.startswith(_recipe_hash() + "-"):
        return False
    age = _base_age_days(label)
    return age is not None and age < BASE_MAX_AGE_DAYS


def remove_built_on(engine: Engine, label: str) -> None:
    """Remove every image (tags and layer cache) built on the base with this label."""
    ids = engine.output("images", "--all", "--quiet", "--filter", f"label={BASE_LABEL}={label}").split()
    if ids:
        subprocess.run(engine.command("rmi", "--force", *sorted(set(ids))), capture_output=True, check=False)


def ensure_base(engine: Engine) -> None:
    """Make localhost/debian:bookworm unless a current one exists (recipe unchanged, under a month old)."""
    old = base_label(engine)
    if base_is_current(old):
        log(f"base {BASE_REF} is current ({old})")
        return
    if not shutil.which("mmdebstrap"):
        raise Failure(f"mmdebstrap is needed to make the local base {BASE_REF}: {INSTALL}")
    why = "missing" if old is None else f"stale ({old}; refreshed every {BASE_MAX_AGE_DAYS} days or on a new recipe)"
    log(f"base {BASE_REF} {why}: bootstrapping Debian bookworm with mmdebstrap (about a minute)")
    stamp = f"{_recipe_hash()}-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"
    with tempfile.TemporaryDirectory(prefix="trainer-base-") as tmp:
        tarball = Path(tmp) / "base.tar"
        proc = subprocess.run([*BASE_RECIPE, "--quiet", str(tarball), *BASE_SOURCES], check=False)
        if proc.returncode != 0:
            raise Failure(f"mmdebstrap failed (exit {proc.returncode}): is http://deb.debian.org reachable? "
                          "See its output above")
        engine.output("import", "--change", f"LABEL {BASE_LABEL}={stamp}", str(tarball), BASE_REF, timeout=600)
    if old is not None and old != "unlabelled":
        remove_built_on(engine, old)  # its layers can never be reused: give the disk back
    log(f"base {BASE_REF} made ({stamp})")


# ---- the wheel source ------------------------------------------------------------------------------

def lock_version(image: str, package: str) -> str | None:
    for line in (ROOT / "images" / image / "requirements-cpu.txt").read_text().splitlines():
        name, _, version = line.strip().partition("==")
        if name.lower() == package:
            return version
    return None


def find_links() -> list[Path]:
    """The host pip's find-links directories (`pip config list`, PIP_FIND_LINKS)."""
    values = os.environ.get("PIP_FIND_LINKS", "").split()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=60, check=False).stdout
        values += [v for m in re.finditer(r"find-links='([^']*)'", out) for v in m.group(1).split()]
    return [Path(v.removeprefix("file://")) for v in dict.fromkeys(values) if not v.startswith("http")]


def local_torch_wheel() -> Path | None:
    """torch's +cpu wheel of the lock's version for the base's Python, if the host has it."""
    version = lock_version("pytorch", "torch")
    tag = "cp" + BASE_PYTHON.replace(".", "")
    for folder in find_links():
        wheels = sorted(folder.glob(f"torch-{version}+cpu-{tag}-{tag}-*linux*x86_64.whl"))
        if wheels:
            return wheels[-1]
    return None


def horovod_wheel_cache() -> Path:
    """build_horovod_wheel.sh's wheel cache (TRAINER_WHEEL_CACHE, else under XDG_CACHE_HOME or ~/.cache)."""
    if os.environ.get("TRAINER_WHEEL_CACHE"):
        return Path(os.environ["TRAINER_WHEEL_CACHE"])
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "trainer-images" / "wheels"


@dataclass(frozen=True)
class WheelSources:
    """Where a local build gets its wheels: torch's index and Horovod's wheel cache (URLs, or None)."""

    torch_index: str | None = None
    horovod_cache: str | None = None


@contextlib.contextmanager
def wheel_index(wheel: Path | None, horovod_cache: Path | None = None) -> Iterator[WheelSources]:
    """Serve ``wheel`` as a one-package simple index and ``horovod_cache`` as it is, on 127.0.0.1 (the
    builds use the host network). The Horovod URL is given even for a cache that does not exist yet: the
    build then compiles, and the build argument (so the layer cache) stays the same either way."""
    if wheel is None and horovod_cache is None:
        yield WheelSources()
        return
    with tempfile.TemporaryDirectory(prefix="trainer-wheels-") as tmp:
        if wheel is not None:
            folder = Path(tmp) / "simple" / "torch"
            folder.mkdir(parents=True)
            (folder / wheel.name).symlink_to(wheel)
        if horovod_cache is not None:
            (Path(tmp) / HOROVOD_CACHE_PATH).symlink_to(horovod_cache, target_is_directory=True)

        class Quiet(http.server.SimpleHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

        handler = functools.partial(Quiet, directory=tmp)
        try:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", WHEEL_PORT), handler)
        except OSError:
            log(f"port {WHEEL_PORT} is busy: serving the wheels on another one (the layer cache will miss)")
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        with server:
            threading.Thread(target=server.serve_forever, daemon=True).start()
            url = f"http://127.0.0.1:{server.server_address[1]}"
            yield WheelSources(f"{url}/simple/" if wheel is not None else None,
                               f"{url}/{HOROVOD_CACHE_PATH}/" if horovod_cache is not None else None)
            server.shutdown()


# ---- builds --------------------------------------------------------------------------------------

def release_build_args(image: str) -> dict[str, str]:
    """What cloudbuild.yaml passes the CPU variant (tests/images/test_local_build.py keeps them equal)."""
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    return {
        "VARIANT": "cpu",
        "REDUCTION_SERVER": "0",
        "VERSION": version.group(1) if version else "0.0.0",
        "REVISION": revision.stdout.strip() if revision.returncode == 0 else "unknown",
    }


def local_build_args(image: str, sources: WheelSources) -> dict[str, str]:
    """The only differences from a release build: the base, its Python and the wheel sources."""
    args = {"CPU_IMAGE": BASE_REF, "PYTHON_VERSION": BASE_PYTHON}
    dockerfile = (ROOT / "images" / image / "Dockerfile").read_text()
    if sources.torch_index and "ARG TORCH_CPU_INDEX_URL" in dockerfile:
        args["TORCH_CPU_INDEX_URL"] = sources.torch_index
    if sources.horovod_cache and "ARG HOROVOD_WHEEL_URL" in dockerfile:
        args["HOROVOD_WHEEL_URL"] = sources.horovod_cache
    return args


def build_command(engine: Engine, image: str, sources: WheelSources) -> list[str]:
    args = {**release_build_args(image), **local_build_args(image, sources)}
    flags = [f"--build-arg={k}={v}" for k, v in args.items()]
    return engine.command("build", *engine.build_flags(), f"--file=images/{image}/Dockerfile", *flags,
                          f"--tag={image_ref(image)}", ".")


def _reachable(url: str) -> str | None:
    """None when ``url`` answers, else why not."""
    try:
        urllib.request.urlopen(url, timeout=15).close()
        return None
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))


def diagnose(image: str, code: int) -> Failure:
    """The one line for a failed build: an unreachable source if that is the cause, else the step above."""
    for name, url in (("PyPI", "https://pypi.org/simple/pip/"),
                      ("Debian's archive", "http://deb.debian.org/debian/dists/bookworm/InRelease")):
        reason = _reachable(url)
        if reason is not None:
            return Failure(f"building {image_ref(image)} failed (exit {code}): {name} ({url}) is unreachable "
                           f"({reason}); the builds install from it: fix the network or proxy, then rerun")
    return Failure(f"building {image_ref(image)} failed (exit {code}) at the step shown above: "
                   f"fix it, then rerun `make image-test`")


def build(engine: Engine, images: Sequence[str]) -> None:
    ensure_base(engine)
    wheel, horovod_cache = local_torch_wheel(), horovod_wheel_cache()
    log(f"torch wheel: {wheel or 'the Dockerfile default TORCH_CPU_INDEX_URL'}")
    cached = sorted(p.parent.name for p in horovod_cache.glob("horovod-*/key.txt"))
    log(f"Horovod wheel cache {horovod_cache}: {', '.join(cached) or 'empty'} (a wheel of the image's key is "
        "used instead of compiling)")
    started = time.monotonic()
    with wheel_index(wheel, horovod_cache) as sources:
        for image in images:
            command = build_command(engine, image, sources)
            log(f"building {image_ref(image)}: {' '.join(command)}")
            began = time.monotonic()
            code = subprocess.run(command, cwd=ROOT, check=False).returncode
            if code != 0:
                raise diagnose(image, code)
            log(f"built {image_ref(image)} in {_minutes(time.monotonic() - began)}")
    log(f"built {', '.join(images)} in {_minutes(time.monotonic() - started)}")


def _minutes(seconds: float) -> str:
    return f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"


# ---- sizes ---------------------------------------------------------------------------------------

def image_size(engine: Engine, ref: str) -> int:
    return int(engine.output("image", "inspect", "--format", "{{.Size}}", ref).strip())


def largest_layers(engine: Engine, ref: str, count: int = 5) -> list[tuple[int, str]]:
    """The ``count`` largest layers: (bytes, the instruction that made it)."""
    if engine.name == "podman":  # podman 4 prints sizes for humans in templates, bytes in JSON
        rows = [(int(layer["size"]), str(layer["CreatedBy"]))
                for layer in json.loads(engine.output("history", "--no-trunc", "--format", "json", ref))]
    else:
        out = engine.output("history", "--no-trunc", "--human=false", "--format", "{{.Size}}\t{{.CreatedBy}}", ref)
        rows = [(int(size), created_by) for size, _, created_by in (line.partition("\t") for line in out.splitlines())
                if size.isdigit()]
    return sorted(((size, " ".join(created_by.split())) for size, created_by in rows), reverse=True)[:count]


def load_budget() -> tuple[float, dict[str, int]]:
    data = json.loads(BUDGET_FILE.read_text())
    return float(data["margin"]), {name: int(size) for name, size in data["bytes"].items()}


def budget_problem(image: str, size: int) -> str | None:
    """Why ``size`` breaks the image's budget, or None."""
    margin, budget = load_budget()
    if image not in budget:
        return f"{image} has no entry in {BUDGET_FILE.relative_to(ROOT)}"
    limit = budget[image] * (1 + margin)
    if size > limit:
        return (f"{image_ref(image)} is {_gb(size)}, over its budget {_gb(budget[image])} + {margin:.0%} "
                f"({BUDGET_FILE.relative_to(ROOT)}): find what grew in its largest layers, cut it, or raise the "
                f"budget in the same change")
    return None


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


def size_report(engine: Engine, images: Sequence[str]) -> list[str]:
    """Print each image's size and largest layers; return the budget problems."""
    problems = []
    for image in images:
        if not engine.exists(image_ref(image)):
            raise Failure(f"{image_ref(image)} is not built: run `make image-test` (or local_build.py build {image})")
        size = image_size(engine, image_ref(image))
        print(f"{image_ref(image)}: {_gb(size)} ({size} bytes)")
        for layer_size, created_by in largest_layers(engine, image_ref(image)):
            print(f"  {_gb(layer_size):>9}  {created_by[:110]}")
        problem = budget_problem(image, size)
        if problem:
            problems.append(problem)
    return problems


# ---- command line --------------------------------------------------------------------------------

def clean(engine: Engine) -> None:
    label = base_label(engine)
    for image in IMAGES:
        subprocess.run(engine.command("rmi", "--force", image_ref(image)), capture_output=True, check=False)
    if label is not None:
        remove_built_on(engine, label)
        subprocess.run(engine.command("rmi", "--force", BASE_REF), capture_output=True, check=False)
    log(f"removed the trainer images, {BASE_REF} and every layer built on it")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    engine_cmd = sub.add_parser("engine", help="print the engine; exit 3 (outside CI) when there is none")
    engine_cmd.add_argument("--install", action="store_true", help=f"as root with apt-get: {INSTALL}")
    sub.add_parser("base", help=f"make {BASE_REF} unless a current one exists")
    build_cmd = sub.add_parser("build", help="build the CPU images, then report their sizes")
    build_cmd.add_argument("images", nargs="*", metavar="IMAGE", help=f"some of {', '.join(IMAGES)} (default: all)")
    sub.add_parser("sizes", help="size and largest layers of each image, checked against the budget")
    sub.add_parser("clean", help=f"remove the images, {BASE_REF} and every layer built on it")
    args = parser.parse_args(argv)
    try:
        if args.command == "engine":
            return _engine_command(args.install)
        unknown = set(getattr(args, "images", None) or ()) - set(IMAGES)
        if unknown:
            raise Failure(f"unknown image(s) {', '.join(sorted(unknown))}: choose from {', '.join(IMAGES)}")
        engine = require_engine(install=args.command == "build")
        if args.command == "base":
            ensure_base(engine)
        elif args.command == "clean":
            clean(engine)
        else:
            images = getattr(args, "images", None) or IMAGES
            if args.command == "build":
                build(engine, images)
            problems = size_report(engine, images)
            for problem in problems:
                print(f"local_build: {problem}", file=sys.stderr)
            return 1 if problems else 0
        return 0
    except Failure as exc:
        print(f"local_build: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("local_build: interrupted", file=sys.stderr)
        return 130


def _engine_command(install: bool) -> int:
    """0 with an engine; without one, one line and 3 (the caller skips the image tests), or 1 under CI."""
    try:
        engine = require_engine(install)
    except Failure as exc:
        consequence = "CI=true: the image tests cannot be skipped" if is_ci() else "skipping the image tests"
        print(f"local_build: {exc} ({consequence})", file=sys.stderr)
        return 1 if is_ci() else EXIT_NO_ENGINE
    log(f"container engine: {engine.output('--version').strip()} ({' '.join(engine.argv)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
