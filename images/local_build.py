#!/usr/bin/env python3
"""Build the trainer images on this machine from the real Dockerfiles: the CPU variants (make image-test, part of
make test) and, once in a while, the GPU variants (make image-test-gpu).

Only build arguments differ from the release build of cloudbuild.yaml: the base (a Debian bookworm root
file system made here with mmdebstrap, because no registry can be pulled from), its Python (3.11), and
where two wheels come from: torch's +cpu wheel (the host's pip find-links directory, served as a local
index) and Horovod's (the host's wheel cache, which `make venv-horovod` fills, served so that the image
build takes a wheel built for exactly its key instead of compiling Horovod a second time). The GPU variants
install their GPU locks from PyPI on the same Debian base (the nvidia-* wheels carry the CUDA runtime); Horovod's
builder stage compiles on a local CUDA devel base made from PyPI's CUDA wheels (cuda_base.py).

    python3 images/local_build.py engine [--install]      # which engine would be used (podman is installed if root)
    python3 images/local_build.py base                    # localhost/debian:bookworm, made once, refreshed monthly
    python3 images/local_build.py build [--gpu] [IMAGE ...]  # localhost/trainer-<image>:cpu|gpu, its SBOM, the gate
    python3 images/local_build.py gate [--gpu] [--osv PATH]... [IMAGE ...]  # the gate on the built images again
    python3 images/local_build.py sizes [--gpu] [IMAGE ...]  # size, 5 largest layers and budget of each image
    python3 images/local_build.py clean                   # the images, the bases and every layer built on them

Docker is used where `docker info` works, otherwise podman (CONTAINER_ENGINE=docker|podman forces one).
Every failure ends in one line saying what failed and what to do, and a non-zero exit.
Standard library only: the container tests (tests/containers/) import this file and its modules for the
same settings. This file is the command line and the builds; the rest sits beside it, one module a concern:

    build_common.py       the repository, the image names, Failure (the one line) and the log line
    container_engine.py   finding, and where possible installing, docker or podman, and their flags
    debian_base.py        the local base localhost/debian:bookworm (mmdebstrap), its label and age
    cuda_base.py          the GPU builds' CUDA devel base, from PyPI's CUDA 13.0 wheels (Horovod's compile only)
    wheel_sources.py      torch's +cpu wheel and Horovod's wheel cache, served on 127.0.0.1
    catalog.py            every images/<name>/image.toml: budgets, GPU facts, test tiers, Cloud Build steps
      image_folders.py      reading the folders: Image, CatalogError
      dockerfile_blocks.py  each Dockerfile from its Dockerfile.in and images/Dockerfile.blocks
      cloud_build.py        cloudbuild.yaml
    image_sizes.py        each image's size, largest layers and budget (image.toml)
    build_inputs.py       a build's inputs as one digest: an image built from the inputs at hand is not built again
    supply_chain.py       the image's bill of materials copied beside its record, its digest, the vulnerability gate
    vuln_gate.py          the gate itself: a bill of materials against OSV advisories and the expiring allowlist
      vuln_versions.py      the ecosystems' version orders (PEP 440, dpkg)
      vuln_findings.py      the bill of materials' packages, the OSV records, the findings where they meet

They import one another by plain name: run as a script, images/ is on sys.path (sys.path[0]).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import build_inputs
import catalog
import supply_chain
from build_common import IMAGES, INSTALL, ROOT, VARIANTS, Failure, image_ref, is_ci, log
from container_engine import Engine, require_engine
from cuda_base import CUDA_DEVEL_REF, ensure_cuda_devel
from debian_base import BASE_PYTHON, BASE_REF, base_label, ensure_base, remove_built_on
from image_sizes import size_report
from wheel_sources import WheelSources, horovod_wheel_cache, local_torch_wheel, wheel_index, wheel_port

EXIT_NO_ENGINE = 3  # `engine` without an engine and outside CI: the caller skips the image tests


# ---- builds --------------------------------------------------------------------------------------

def release_build_args(image: str, variant: str = "cpu") -> dict[str, str]:
    """What cloudbuild.yaml passes the variant (tests/images/test_local_build.py keeps them equal); the GPU
    variant without the Reduction Server plugin, whose apt repository cannot be reached here."""
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    return {
        "VARIANT": variant,
        "REDUCTION_SERVER": "0",
        "VERSION": version.group(1) if version else "0.0.0",
        "REVISION": revision.stdout.strip() if revision.returncode == 0 else "unknown",
    }


def local_build_args(image: str, sources: WheelSources, variant: str = "cpu") -> dict[str, str]:
    """The only differences from a release build: the bases, their Python and the wheel sources."""
    dockerfile = (ROOT / "images" / image / "Dockerfile").read_text()
    if variant == "gpu":
        args = {"CUDA_IMAGE": BASE_REF, "PYTHON_VERSION": BASE_PYTHON}
        if "ARG CUDA_DEVEL_IMAGE" in dockerfile:
            args["CUDA_DEVEL_IMAGE"] = CUDA_DEVEL_REF
    else:
        args = {"CPU_IMAGE": BASE_REF, "PYTHON_VERSION": BASE_PYTHON}
        if sources.torch_index and "ARG TORCH_CPU_INDEX_URL" in dockerfile:
            args["TORCH_CPU_INDEX_URL"] = sources.torch_index
    if sources.horovod_cache and "ARG HOROVOD_WHEEL_URL" in dockerfile:
        args["HOROVOD_WHEEL_URL"] = sources.horovod_cache
    return args


def build_command(engine: Engine, image: str, sources: WheelSources, variant: str = "cpu") -> list[str]:
    args = {**release_build_args(image, variant), **local_build_args(image, sources, variant)}
    flags = [f"--build-arg={k}={v}" for k, v in args.items()]
    return engine.command("build", *engine.build_flags(), f"--file=images/{image}/Dockerfile", *flags,
                          f"--tag={image_ref(image, variant)}", ".")


def _reachable(url: str) -> str | None:
    """None when ``url`` answers, else why not."""
    try:
        urllib.request.urlopen(url, timeout=15).close()
        return None
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))


def diagnose(image: str, code: int, variant: str = "cpu") -> Failure:
    """The one line for a failed build: an unreachable source if that is the cause, else the step above."""
    for name, url in (("PyPI", "https://pypi.org/simple/pip/"),
                      ("Debian's archive", "http://deb.debian.org/debian/dists/bookworm/InRelease")):
        reason = _reachable(url)
        if reason is not None:
            return Failure(f"building {image_ref(image, variant)} failed (exit {code}): {name} ({url}) is unreachable "
                           f"({reason}); the builds install from it: fix the network or proxy, then rerun")
    target = "image-test" if variant == "cpu" else "image-test-gpu"
    return Failure(f"building {image_ref(image, variant)} failed (exit {code}) at the step shown above: "
                   f"fix it, then rerun `make {target}`")


def needs_cuda_devel(image: str) -> bool:
    """Whether the image's GPU build compiles on the CUDA devel base (its Dockerfile takes ARG CUDA_DEVEL_IMAGE)."""
    return "ARG CUDA_DEVEL_IMAGE" in (ROOT / "images" / image / "Dockerfile").read_text()


# every image's Dockerfile starts with it, in the same instructions (images/Dockerfile.blocks)
SHARED_STAGE = "python-base"


def build_shared_stage(engine: Engine, variant: str = "cpu") -> None:
    """The stage every image starts from (Python, tini, the user, an empty venv with the pinned pip tooling), built
    once before the images build side by side (`make test`): each then finds its layers in the engine's cache instead
    of running the same apt-get and pip as the others beside it (about 20 s of CPU an image)."""
    image = IMAGES[0]  # any: no wheels are served to it (the stage takes none), and the stage is the same in each
    command = [arg for arg in build_command(engine, image, WheelSources(), variant) if not arg.startswith("--tag=")]
    log(f"building the images' shared stage {SHARED_STAGE} (from images/{image}/Dockerfile)")
    code = subprocess.run([*command[:-1], f"--target={SHARED_STAGE}", command[-1]], cwd=ROOT, check=False).returncode
    if code != 0:
        raise diagnose(image, code, variant)


def build(engine: Engine, images: Sequence[str], variant: str = "cpu", databases: Sequence[Path] = (),
          allowlist: Path = supply_chain.ALLOWLIST) -> None:
    """Build each image unless it is current; then keep its bill of materials beside it and run the gate on it."""
    ensure_base(engine)
    devel = variant == "gpu" and any(needs_cuda_devel(image) for image in images)
    if devel:
        ensure_cuda_devel(engine)
    wheel, horovod_cache = local_torch_wheel() if variant == "cpu" else None, horovod_wheel_cache()
    if variant == "cpu":
        log(f"torch wheel: {wheel or 'the Dockerfile default TORCH_CPU_INDEX_URL'}")
    cached = sorted(p.parent.name for p in horovod_cache.glob("horovod-*/key.txt"))
    log(f"Horovod wheel cache {horovod_cache}: {', '.join(cached) or 'empty'} (a wheel of the image's key is "
        "used instead of compiling)")
    bases = [BASE_REF, *([CUDA_DEVEL_REF] if devel else [])]
    ids = [engine.image_id(base) for base in bases]
    started, base_id = time.monotonic(), None if None in ids else " ".join(str(i) for i in ids)
    for image in images:
        ref = image_ref(image, variant)
        with wheel_index(wheel, horovod_cache, wheel_port(image)) as sources:
            served = [*([wheel] if wheel else []), *sorted(horovod_cache.glob("horovod-*/*"))]
            command = build_command(engine, image, sources, variant)
            inputs = build_inputs.digest(build_inputs.without_revision(command), base_id, served)
            began, replaced = time.monotonic(), engine.image_id(ref)
            if inputs is not None and replaced is not None and build_inputs.is_current(ref, replaced, inputs):
                log(f"{ref} is current: built from these inputs ({inputs[:12]}: the context, the build arguments, "
                    "the base and the wheels), not built again")
                gate(engine, [image], variant, databases, allowlist)
                continue
            log(f"building {ref}: {' '.join(command)}")
            code = subprocess.run(command, cwd=ROOT, check=False).returncode
            if code != 0:
                raise diagnose(image, code, variant)
            engine.remove_replaced(ref, replaced)
            built = engine.image_id(ref)
            if inputs is not None and built is not None:
                build_inputs.remember(ref, built, inputs)
            log(f"built {ref} in {_minutes(time.monotonic() - began)}")
            gate(engine, [image], variant, databases, allowlist)
    log(f"{', '.join(images)} ({variant}) ready in {_minutes(time.monotonic() - started)}")


def gate(engine: Engine, images: Sequence[str], variant: str, databases: Sequence[Path] = (),
         allowlist: Path = supply_chain.ALLOWLIST) -> None:
    """Each built image's bill of materials beside it, then the vulnerability gate on it (a Failure fails the build)."""
    for image in images:
        if not engine.exists(image_ref(image, variant)):
            raise Failure(f"{image_ref(image, variant)} is not built: `python3 images/local_build.py build {image}`")
        supply_chain.check(image, variant, supply_chain.keep_sbom(engine, image, variant), databases, allowlist)


def gpu_facts(engine: Engine, image: str) -> dict[str, object]:
    """Run the GPU image once (no GPU needed) and read what it reports; a Failure if it lacks its CUDA build."""
    ref, spec = image_ref(image, "gpu"), catalog.image(image)
    if not spec.gpu_facts:
        log(f"{ref}: images/{image}/{catalog.SPEC} has no [gpu_facts] script: nothing to check")
        return {}
    out = engine.output("run", "--rm", *engine.run_flags(), "--entrypoint", "python", ref, "-c", spec.gpu_facts,
                        timeout=600)
    facts: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    log(f"{ref}: {json.dumps(facts)}")
    if not all(facts.get(key) for key in spec.gpu_must):
        raise Failure(f"{ref} is not a CUDA build: {json.dumps(facts)} (each of {', '.join(spec.gpu_must)} must be "
                      f"true: images/{image}/{catalog.SPEC} [gpu_facts])")
    return facts


def _minutes(seconds: float) -> str:
    return f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"


# ---- command line --------------------------------------------------------------------------------

def clean(engine: Engine) -> None:
    label = base_label(engine)
    refs = [image_ref(image, variant) for image in IMAGES for variant in VARIANTS]
    for ref in [*refs, CUDA_DEVEL_REF]:
        subprocess.run(engine.command("rmi", "--force", ref), capture_output=True, check=False)
    if label is not None:
        remove_built_on(engine, label)
        subprocess.run(engine.command("rmi", "--force", BASE_REF), capture_output=True, check=False)
    log(f"removed the trainer images, {BASE_REF}, {CUDA_DEVEL_REF} and every layer built on them")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    engine_cmd = sub.add_parser("engine", help="print the engine; exit 3 (outside CI) when there is none")
    engine_cmd.add_argument("--install", action="store_true", help=f"as root with apt-get: {INSTALL}")
    sub.add_parser("base", help=f"make {BASE_REF} unless a current one exists, then the images' shared first stage")
    build_cmd = sub.add_parser("build", help="build the CPU (or GPU) images, then report their sizes")
    sizes_cmd = sub.add_parser("sizes", help="size and largest layers of each image, checked against the budget")
    for cmd in (build_cmd, sizes_cmd):
        cmd.add_argument("images", nargs="*", metavar="IMAGE", help=f"some of {', '.join(IMAGES)} (default: all)")
        cmd.add_argument("--gpu", action="store_true", help="the GPU variants (localhost/trainer-<image>:gpu)")
    gate_cmd = sub.add_parser("gate", help="the vulnerability gate on the built images (their SBOM beside them)")
    for cmd in (build_cmd, gate_cmd):
        cmd.add_argument("--osv", type=Path, action="append", default=[], metavar="PATH",
                         help="OSV advisories: osv.dev's <ecosystem>/all.zip, a directory or a JSON file (repeatable; "
                         "default none: the allowlist alone is checked)")
        cmd.add_argument("--allowlist", type=Path, default=supply_chain.ALLOWLIST, help="default %(default)s")
    gate_cmd.add_argument("images", nargs="*", metavar="IMAGE", help=f"some of {', '.join(IMAGES)} (default: all)")
    gate_cmd.add_argument("--gpu", action="store_true", help="the GPU variants")
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
            build_shared_stage(engine)
        elif args.command == "clean":
            clean(engine)
        elif args.command == "gate":
            gate(engine, args.images or IMAGES, "gpu" if args.gpu else "cpu", args.osv, args.allowlist)
        else:
            images = getattr(args, "images", None) or IMAGES
            variant = "gpu" if args.gpu else "cpu"
            if args.command == "build":
                build(engine, images, variant, args.osv, args.allowlist)
            if variant == "gpu":
                for image in images:
                    gpu_facts(engine, image)
            problems = size_report(engine, images, variant)
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
