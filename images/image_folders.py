"""Every image is one folder, ``images/<name>/``: its Dockerfile, its locks (``requirements.txt`` for the GPU variant,
``requirements-cpu.txt`` for the CPU one) and ``image.toml``, which says everything else the build, the tests and
Cloud Build need to know about it. This module reads one folder, or all of them, into an ``Image`` and refuses a
folder it cannot read in one line (``CatalogError``); what is derived from them is catalog.py's (the Make variables,
its command line), cloud_build.py's (cloudbuild.yaml) and dockerfile_blocks.py's (the Dockerfiles). Standard library
only (Python >= 3.11, ``tomllib``).
"""

from __future__ import annotations

import re
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
    over: tuple[str, ...] = ()  # its venv sits over these images' venvs and installs only what its lock adds
    after: str = ""  # a script in its folder run with the venv's path once the lock is in (Horovod: its wheel)
    build_needs_venv: bool = False  # its image build takes what that script made (Horovod's wheel: compiled once)
    # its image build waits for these images' builds: its Dockerfile starts a stage from their layers, which the
    # engine's layer cache then holds (Horovod's CPU builder on the TensorFlow image's venv: TensorFlow installed once)
    build_after: tuple[str, ...] = ()

    @property
    def xdist_variable(self) -> str:
        return f"XDIST_{self.name.upper()}"


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise CatalogError(f"{where} must be a list of non-empty strings")
    return tuple(value)


def _over(value: Any, where: str) -> tuple[str, ...]:
    """[venv] over: one image's name, or a list of them (the venv sits over each; where their pins agree, what they
    hold is installed once)."""
    return (value,) if isinstance(value, str) and value else _strings(value, f"{where} [venv] over") if value else ()


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
                       "gpu_facts", "tests", "venv", "build_after"}, where)
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
            containers=str(tests.get("containers", DEFAULT_GROUP)), over=_over(venv.get("over", ()), where),
            after=str(venv.get("after", "")), build_needs_venv=bool(venv.get("build_needs_venv", False)),
            build_after=_strings(data.get("build_after", []), f"{where} build_after"))
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
        for after in image.build_after:
            if after not in names or after == image.name:
                raise CatalogError(f"images/{image.name}/{SPEC} build_after names {after!r}, which is no other image")
        for over in image.over:
            if over not in names:
                raise CatalogError(f"images/{image.name}/{SPEC} [venv] over names {over!r}, which is no image")
            if over == image.name:
                raise CatalogError(f"images/{image.name}/{SPEC} [venv] over names the image itself")
    if sum(i.catch_all for i in found) > 1:
        raise CatalogError(f"more than one image's [tests] catch_all is true: "
                           f"{', '.join(i.name for i in found if i.catch_all)} (one tier runs the unclaimed tests)")
    markers = [i.marker for i in found]
    if len(markers) != len(set(markers)):
        raise CatalogError(f"two images' tiers share a marker: {', '.join(sorted(markers))}")
    return found
