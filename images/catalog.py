#!/usr/bin/env python3
"""Every image is one folder, ``images/<name>/``: its Dockerfile, its locks (``requirements.txt`` for the GPU variant,
``requirements-cpu.txt`` for the CPU one) and ``image.toml``, which says everything else the build, the tests and
Cloud Build need to know about it. This module reads the folders; everything per image is derived from it:

- the Make targets: ``venv-<name>``, ``test-<name>``, ``image-<name>``, ``test-containers-<group>``, ``build-<name>``
  (``python3 images/catalog.py make`` writes the variables the Makefile's templates expand; make writes them to
  ``.build/images.mk`` again whenever an ``image.toml`` changes),
- the test tiers and their pytest markers (``tests/conftest.py`` registers each image's marker),
- each image's size budget (``image_sizes.py``) and what its GPU variant must report (``local_build.py``),
- ``cloudbuild.yaml`` (``python3 images/catalog.py cloudbuild > cloudbuild.yaml``; a test keeps it current),
- each image's Dockerfile, from what is its own (``images/<name>/Dockerfile.in``) and the stages every image shares
  (``images/Dockerfile.blocks``): ``python3 images/catalog.py dockerfiles`` writes them; a test keeps them current.

Adding an image is its folder plus, inside ``entrypoint/``, its framework's package and registry line
(docs/ARCHITECTURE.md); nothing else names it. Standard library only (Python >= 3.11, ``tomllib``).

    python3 images/catalog.py make          # the Make variables of every image
    python3 images/catalog.py cloudbuild    # cloudbuild.yaml
    python3 images/catalog.py dockerfiles   # images/<name>/Dockerfile from its Dockerfile.in and the shared blocks
    python3 images/catalog.py check         # read every folder; one line naming what is wrong, exit 1
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ROOT / "images"
SPEC = "image.toml"
VARIANTS = ("gpu", "cpu")  # Cloud Build builds and pushes both; make test builds and runs the CPU one
SIZE_MARGIN = 0.1  # a build more than this fraction above its budget fails (raise a budget in the change that needs it)
DEFAULT_GROUP = "main"  # the container tests' tier of the images that name no group of their own: `containers`
NAME = re.compile(r"[a-z][a-z0-9]*")  # an image's name: its folder, Make targets, tags (`<name>`, `<name>-cpu`)
SBOM_PATH = "/usr/share/trainer/sbom.cdx.json"  # every image's bill of materials (entrypoint/outputs/sbom.py)
# The one line every Dockerfile's runtime stage has after its last install, before USER (docs/images.md, "Bill of
# materials"; tests/images/test_dockerfiles.py checks each): the package, installed in the layer before, inventories
# the OS packages and the venv's; a change of the package rebuilds it.
SBOM_LINE = f'RUN python -m entrypoint sbom write --variant "${{VARIANT}}" {SBOM_PATH}'
OSV_EXPORTS = ("PyPI", "Ubuntu")  # osv.dev's exports the gate reads in Cloud Build (the images are Ubuntu's)
ALLOWLIST = "images/vulnerability-allowlist.toml"
BLOCKS = FOLDERS / "Dockerfile.blocks"  # the stages every image shares, written once: ``#@@ <name>`` starts one
SOURCE = "Dockerfile.in"  # an image's own part of its Dockerfile; ``#@ <block> [argument]`` places a shared block


class CatalogError(Exception):
    """An image folder that cannot be read: the message names the file and what is wrong (one line)."""


@dataclass(frozen=True)
class Image:
    """One ``images/<name>/`` folder, as ``image.toml`` describes it."""

    name: str
    framework: str  # the framework package it ships (TRAINER_FRAMEWORK; that framework's record names this image)
    smoke_module: str  # every build's self-test runs `entrypoint describe --module` with it
    build_checks: tuple[str, ...]  # what the Dockerfile's build-time smoke check must run
    size_budget: dict[str, int]  # bytes per variant, as measured after images/slim_venv.sh
    strategy: str = ""  # what `describe` plans for smoke_module on 2 replicas (the container tests check it)
    cpu_facts: str = ""  # Python printing one JSON line of what the CPU variant imports (the container tests)
    gpu_check: str = ""  # Cloud Build's extra self-test of the GPU variant (Python code)
    gpu_facts: str = ""  # Python printing one JSON line of what the GPU variant reports with no GPU at hand
    gpu_must: tuple[str, ...] = ()  # the keys of that line that must be true: else it is not a CUDA build
    marker: str = ""  # its test tier's pytest marker (make test-<name>: pytest -m <marker> in .venv/<name>)
    workers: int = 0  # the tier's pytest-xdist workers in make test (XDIST_<NAME>)
    catch_all: bool = False  # the tier also runs every test no other tier claims (unit, image-static, bench)
    env: dict[str, str] = field(default_factory=dict)  # the tier's variables ("{venv}": the venv's absolute path)
    containers: str = DEFAULT_GROUP  # the tier that runs its container tests (make test-containers-<group>)
    over: str = ""  # its venv sits over this image's venv and installs only what its lock adds
    after: str = ""  # a script in its folder run with the venv's path once the lock is in (Horovod: its wheel)
    build_needs_venv: bool = False  # its image build takes what that script made (Horovod's wheel: compiled once)

    @property
    def xdist_variable(self) -> str:
        return f"XDIST_{self.name.upper()}"


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise CatalogError(f"{where} must be a list of non-empty strings")
    return tuple(value)


def _check_keys(table: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise CatalogError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")


def read(folder: Path) -> Image:
    """The image of one folder; a CatalogError naming the file and the key when something is missing or wrong."""
    spec = folder / SPEC
    where = str(spec.relative_to(ROOT)) if spec.is_relative_to(ROOT) else str(spec)
    if not NAME.fullmatch(folder.name):
        raise CatalogError(f"{folder.name!r} cannot name an image (lower-case letters and digits): rename its folder")
    if not spec.is_file():
        raise CatalogError(f"{where} is missing: every images/<name>/ with a Dockerfile needs one ({__file__})")
    try:
        data = tomllib.loads(spec.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{where} is not valid TOML: {exc}") from None
    _check_keys(data, {"framework", "smoke_module", "build_checks", "gpu_check", "size_budget", "cpu_facts",
                       "gpu_facts", "tests", "venv"}, where)
    try:
        budget = {variant: int(data["size_budget"][variant]) for variant in VARIANTS}
        tests, venv, facts = data.get("tests", {}), data.get("venv", {}), data.get("gpu_facts", {})
        cpu_facts = data.get("cpu_facts", {})
        _check_keys(tests, {"marker", "workers", "catch_all", "env", "containers", "strategy"}, f"{where} [tests]")
        _check_keys(cpu_facts, {"script"}, f"{where} [cpu_facts]")
        _check_keys(venv, {"over", "after", "build_needs_venv"}, f"{where} [venv]")
        _check_keys(facts, {"script", "must"}, f"{where} [gpu_facts]")
        image = Image(
            name=folder.name, framework=str(data["framework"]), smoke_module=str(data["smoke_module"]),
            build_checks=_strings(data.get("build_checks", []), f"{where} build_checks"), size_budget=budget,
            strategy=str(tests.get("strategy", "")), cpu_facts=str(cpu_facts.get("script", "")),
            gpu_check=str(data.get("gpu_check", "")), gpu_facts=str(facts.get("script", "")),
            gpu_must=_strings(facts.get("must", []), f"{where} [gpu_facts] must"),
            marker=str(tests.get("marker", folder.name)), workers=int(tests.get("workers", 0)),
            catch_all=bool(tests.get("catch_all", False)),
            env={str(k): str(v) for k, v in dict(tests.get("env", {})).items()},
            containers=str(tests.get("containers", DEFAULT_GROUP)), over=str(venv.get("over", "")),
            after=str(venv.get("after", "")), build_needs_venv=bool(venv.get("build_needs_venv", False)))
    except KeyError as exc:
        raise CatalogError(f"{where} lacks {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise CatalogError(f"{where}: {exc}") from None
    if "'" in image.gpu_check:
        raise CatalogError(f"{where} gpu_check: no single quotes (it runs as python -c '...')")
    if image.after and not (folder / image.after).is_file():
        raise CatalogError(f"{where} [venv] after names {image.after!r}, which is not in {folder.name}/")
    if image.build_needs_venv and not image.after:
        raise CatalogError(f"{where} [venv] build_needs_venv needs an `after` script that makes what the build takes")
    return image


def image(name: str) -> Image:
    """What images/<name>/image.toml says about that image."""
    return read(FOLDERS / name)


def images(root: Path = FOLDERS) -> tuple[Image, ...]:
    """Every image: each folder of ``root`` with a Dockerfile, by name."""
    found = tuple(read(p.parent) for p in sorted(root.glob("*/Dockerfile")))
    names = {i.name for i in found}
    for image in found:
        if image.over and image.over not in names:
            raise CatalogError(f"images/{image.name}/{SPEC} [venv] over names {image.over!r}, which is no image")
        if image.over == image.name:
            raise CatalogError(f"images/{image.name}/{SPEC} [venv] over names the image itself")
    if sum(i.catch_all for i in found) > 1:
        raise CatalogError(f"more than one image's [tests] catch_all is true: "
                           f"{', '.join(i.name for i in found if i.catch_all)} (one tier runs the unclaimed tests)")
    markers = [i.marker for i in found]
    if len(markers) != len(set(markers)):
        raise CatalogError(f"two images' tiers share a marker: {', '.join(sorted(markers))}")
    return found


def container_groups(found: tuple[Image, ...]) -> dict[str, list[str]]:
    """group -> its images; the default group first."""
    groups: dict[str, list[str]] = {DEFAULT_GROUP: []}
    for image in found:
        groups.setdefault(image.containers, []).append(image.name)
    return {g: names for g, names in groups.items() if names}


def group_tier(group: str) -> str:
    return "containers" if group == DEFAULT_GROUP else f"containers-{group}"


def group_selection(group: str, groups: dict[str, list[str]]) -> str:
    """The ``-k`` expression of a group's container tests: its images' names, or (the default group) every test
    that names no image of another group."""
    if group != DEFAULT_GROUP:
        return " or ".join(groups[group])
    others = [name for g, names in groups.items() if g != DEFAULT_GROUP for name in names]
    if not others:
        return ""
    return f"not {others[0]}" if len(others) == 1 else f"not ({' or '.join(others)})"


def tier_marker(image: Image, found: tuple[Image, ...]) -> str:
    """The tier's ``-m`` expression: its marker, or (the catch-all tier) no other image's marker (the Makefile adds
    its own tiers' markers, jobs and containers)."""
    if not image.catch_all:
        return image.marker
    return " and ".join(f"not {other.marker}" for other in found if other is not image)


def make_variables(found: tuple[Image, ...]) -> str:
    """What the Makefile's templates expand, per image and per container group."""
    lines = [f"# Generated by images/catalog.py from images/*/{SPEC}: do not edit (make writes it again).",
             f"IMAGE_NAMES := {' '.join(i.name for i in found)}"]
    for image in found:
        env = " ".join(f"{k}={v.replace('{venv}', f'$(abspath $(VENV_DIR)/{image.name})')}"
                       for k, v in image.env.items())
        lines += [f"IMG_{image.name}_MARKER := {tier_marker(image, found)}",
                  f"IMG_{image.name}_CATCH_ALL := {'1' if image.catch_all else ''}",
                  f"IMG_{image.name}_ENV = {env}",
                  f"IMG_{image.name}_OVER := {image.over}",
                  f"IMG_{image.name}_AFTER := {f'images/{image.name}/{image.after}' if image.after else ''}",
                  f"IMG_{image.name}_BUILD_NEEDS_VENV := {'1' if image.build_needs_venv else ''}",
                  f"IMG_{image.name}_XDIST := {image.xdist_variable}",
                  f"{image.xdist_variable} ?= {image.workers}"]
    groups = container_groups(found)
    lines.append(f"CONTAINER_GROUPS := {' '.join(groups)}")
    for group, names in groups.items():
        lines += [f"CONTAINER_{group}_IMAGES := {' '.join(names)}",
                  f"CONTAINER_{group}_TIER := {group_tier(group)}",
                  f"CONTAINER_{group}_SELECT := {group_selection(group, groups)}"]
    return "\n".join(line.rstrip() for line in lines) + "\n"


CLOUDBUILD_HEAD = """\
# Generated by images/catalog.py from images/*/image.toml: do not edit
# (python3 images/catalog.py cloudbuild > cloudbuild.yaml; a test checks that it is current).
#
# Cloud Build: builds every trainer image, GPU and CPU variant, in parallel; self-tests each one; and
# pushes them all to Artifact Registry only once every step has passed (the `images:` list).
#
#   make cloudbuild PROJECT_ID=my-project TAG=v0.1.0
#   gcloud builds submit --config cloudbuild.yaml --substitutions=_TAG=v0.1.0,_REVISION=$(git rev-parse HEAD) .
#
# Pushed as ${_REGION}-docker.pkg.dev/$PROJECT_ID/${_REPOSITORY}/<image>:${_TAG} (GPU) and
# <image>-cpu:${_TAG} (CPU), with Cloud Build's SLSA provenance (VERIFIED: no provenance, no build). Each image's bill
# of materials (/usr/share/trainer/sbom.cdx.json, made in its build) is judged by the vulnerability gate against
# osv.dev's advisories and images/vulnerability-allowlist.toml, then uploaded with the gate's report to
# gs://${PROJECT_ID}_cloudbuild/sbom/${_TAG}/ (`make cloudbuild-sbom` attaches them in Artifact Registry).
# images/images.mk offers the same builds locally (make build, make push). docs/images.md.
# The Artifact Registry repository must exist:
#   gcloud artifacts repositories create trainers --repository-format=docker --location=us-central1

substitutions:
  _REGION: us-central1
  _REPOSITORY: trainers
  _TAG: dev
  _VERSION: 0.1.0
  _REVISION: unknown  # make cloudbuild passes `git rev-parse HEAD`
  _REDUCTION_SERVER: "0"  # "1": GPU images get the Google Reduction Server NCCL plugin

options:
  machineType: E2_HIGHCPU_32  # 32 vCPUs: six parallel builds, one of them compiling Horovod
  diskSizeGb: 300  # six CUDA/CPU images with their layers and build caches
  requestedVerifyOption: VERIFIED  # SLSA provenance for every image pushed (images:), or the build fails
  env:
    - DOCKER_BUILDKIT=1  # BuildKit skips the stages of the other variant (no CUDA base pulled for CPU builds)

timeout: 7200s

steps:
"""
REF = "${_REGION}-docker.pkg.dev/$PROJECT_ID/${_REPOSITORY}/%s:${_TAG}"
SBOM_BUCKET = "gs://${PROJECT_ID}_cloudbuild/sbom/${_TAG}/"  # the build's default bucket: each SBOM and gate report


def _repository(image: Image, variant: str) -> str:
    return image.name if variant == "gpu" else f"{image.name}-cpu"


def _osv_step() -> list[str]:
    """osv.dev's advisory exports, fetched once at the start (the gate's database; nothing else downloads them)."""
    fetch = [f"gsutil -q cp gs://osv-vulnerabilities/{eco}/all.zip osv/{eco}.zip" for eco in OSV_EXPORTS]
    return ["  - id: osv-database", "    name: gcr.io/cloud-builders/gsutil", "    waitFor: ['-']",
            "    entrypoint: bash", "    args:", "      - -euo", "      - pipefail", "      - -c", "      - |",
            "        mkdir -p osv", *(f"        {f}" for f in fetch)]


def _gate_step(image: Image, variant: str) -> list[str]:
    """The vulnerability gate on one image's bill of materials, run by the image's own Python (stdlib only)."""
    repo = _repository(image, variant)
    args = ["images/vuln_gate.py", "--sbom", f"sbom/{repo}.cdx.json",
            *(a for eco in OSV_EXPORTS for a in ("--osv", f"osv/{eco}.zip")), "--allowlist", ALLOWLIST,
            "--image", image.name, "--report", f"sbom/{repo}.vulnerabilities.json"]
    return [f"  - id: gate-{repo}", f"    name: {REF % repo}", f"    waitFor: [test-{repo}, osv-database]",
            "    entrypoint: python", "    args:", *(f"      - {a}" for a in args)]


def cloudbuild(found: tuple[Image, ...]) -> str:
    """cloudbuild.yaml: the advisory database and every image's two builds at once; each variant's self-test and
    bill of materials after its build, the vulnerability gate on it; then the push (with provenance) and the upload
    of the bills of materials and the gate's reports."""
    out = [CLOUDBUILD_HEAD.rstrip("\n"),
           "  # ---- the vulnerability gate's advisory database; builds: all start at once", *_osv_step()]
    for image in found:
        for variant in VARIANTS:
            step = f"build-{_repository(image, variant)}"
            server = "${_REDUCTION_SERVER}" if variant == "gpu" else "0"
            out += [f"  - id: {step}", "    name: gcr.io/cloud-builders/docker", "    waitFor: ['-']", "    args:",
                    "      - build", f"      - --file=images/{image.name}/Dockerfile",
                    f"      - --build-arg=VARIANT={variant}", f"      - --build-arg=REDUCTION_SERVER={server}",
                    "      - --build-arg=VERSION=${_VERSION}", "      - --build-arg=REVISION=${_REVISION}",
                    f"      - --tag={REF % _repository(image, variant)}", "      - ."]
    out += ["  # ---- self-tests: the planner runs in the image, and the real ENTRYPOINT (tini -> entrypoint run) "
            "answers;", "  #    a GPU variant's own check (images/<name>/image.toml gpu_check) where it has one; then "
            "its bill of materials", "  #    is copied out for the gate and the upload"]
    for image in found:
        for variant in VARIANTS:
            ref = REF % _repository(image, variant)
            runs = [f"docker run --rm --entrypoint python {ref} -m entrypoint describe --module {image.smoke_module}",
                    f"docker run --rm {ref} --help"]
            if variant == "gpu" and image.gpu_check:
                runs.append(f"docker run --rm --entrypoint python {ref} -c '{image.gpu_check}'")
            repo = _repository(image, variant)
            runs += ["mkdir -p sbom && chmod 1777 sbom  # the gate's step runs as the image's user",
                     f"docker run --rm --entrypoint cat {ref} {SBOM_PATH} > sbom/{repo}.cdx.json"]
            out += [f"  - id: test-{_repository(image, variant)}", "    name: gcr.io/cloud-builders/docker",
                    f"    waitFor: [build-{_repository(image, variant)}]", "    entrypoint: bash", "    args:",
                    "      - -euo", "      - pipefail", "      - -c", "      - |", *(f"        {r}" for r in runs)]
    out += ["  # ---- the vulnerability gate (images/vuln_gate.py): each bill of materials against osv.dev's",
            f"  #    advisories and {ALLOWLIST}: a fixable high or critical finding it does not name,",
            "  #    or an expired entry, fails the build before anything is pushed"]
    for image in found:
        for variant in VARIANTS:
            out += _gate_step(image, variant)
    out += ["", "images:", *(f"  - {REF % _repository(i, v)}" for i in found for v in VARIANTS),
            "", "artifacts:", "  objects:", f"    location: {SBOM_BUCKET}", "    paths:",
            "      - sbom/*.cdx.json", "      - sbom/*.vulnerabilities.json"]
    return "\n".join(out) + "\n"


def blocks(path: Path = BLOCKS) -> dict[str, str]:
    """The shared blocks by name (a block ends at the next ``#@@`` line; its trailing blank lines are dropped)."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in path.read_text().splitlines():
        if line.startswith("#@@ "):
            current = found.setdefault(line[4:].strip(), [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).rstrip("\n") for name, lines in found.items()}


def dockerfile(image: Image, folder: Path | None = None, shared: dict[str, str] | None = None) -> str | None:
    """The Dockerfile ``images/<name>/Dockerfile.in`` makes with the shared blocks (None: the image has no
    Dockerfile.in, its Dockerfile is written by hand). In a block, ``@NAME@`` is the image's name, ``@FRAMEWORK@``
    its framework and ``@ARG@`` the argument its ``#@`` line gives."""
    source = (folder or FOLDERS / image.name) / SOURCE
    if not source.is_file():
        return None
    found = blocks() if shared is None else shared

    def expand(text: str, where: str, depth: int) -> list[str]:
        out: list[str] = []
        for line in text.split("\n"):
            if not line.startswith("#@ "):
                out.append(line)
                continue
            name, _, arg = line[3:].strip().partition(" ")
            if name not in found:
                raise CatalogError(f"{where}: no block {name!r} in {BLOCKS.name} (it has {', '.join(sorted(found))})")
            block = found[name]
            if ("@ARG@" in block) != bool(arg) or depth > 3:
                raise CatalogError(f"{where}: block {name!r} " + ("nests too deep" if depth > 3 else
                                   "takes an argument" if arg == "" else "takes no argument"))
            block = block.replace("@NAME@", image.name).replace("@FRAMEWORK@", image.framework).replace("@ARG@", arg)
            out += expand(block, f"{BLOCKS.name} block {name!r}", depth + 1)
        return out

    return "\n".join(expand(source.read_text(), f"images/{image.name}/{SOURCE}", 0))


def write_dockerfiles(found: tuple[Image, ...]) -> list[str]:
    """Write every generated Dockerfile that is not current; the ones written."""
    written = []
    for image in found:
        text = dockerfile(image)
        target = FOLDERS / image.name / "Dockerfile"
        if text is not None and target.read_text() != text:
            target.write_text(text)
            written.append(str(target.relative_to(ROOT)))
    return written


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("make", "cloudbuild", "dockerfiles", "check"):
        print("usage: python3 images/catalog.py {make,cloudbuild,dockerfiles,check}", file=sys.stderr)
        return 2
    try:
        found = images()
    except CatalogError as exc:
        print(f"catalog: {exc}", file=sys.stderr)
        return 1
    if argv[0] == "make":
        sys.stdout.write(make_variables(found))
    elif argv[0] == "cloudbuild":
        sys.stdout.write(cloudbuild(found))
    elif argv[0] == "dockerfiles":
        for path in write_dockerfiles(found):
            print(f"catalog: wrote {path}")
    else:
        print(f"catalog: {len(found)} images: {', '.join(i.name for i in found)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
