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
Standard library only: the container tests (tests/containers/) import this file and its modules for the
same settings. This file is the command line and the builds; the rest sits beside it, one module a concern:

    build_common.py       the repository, the image names, Failure (the one line) and the log line
    container_engine.py   finding, and where possible installing, docker or podman, and their flags
    debian_base.py        the local base localhost/debian:bookworm (mmdebstrap), its label and age
    wheel_sources.py      torch's +cpu wheel and Horovod's wheel cache, served on 127.0.0.1
    image_sizes.py        each image's size, largest layers and budget (size-budget.json)

They import one another by plain name: run as a script, images/ is on sys.path (sys.path[0]).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from build_common import IMAGES, INSTALL, ROOT, Failure, image_ref, is_ci, log
from container_engine import Engine, require_engine
from debian_base import BASE_PYTHON, BASE_REF, base_label, ensure_base, remove_built_on
from image_sizes import size_report
from wheel_sources import WheelSources, horovod_wheel_cache, local_torch_wheel, wheel_index

EXIT_NO_ENGINE = 3  # `engine` without an engine and outside CI: the caller skips the image tests


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
