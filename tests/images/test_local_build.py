"""images/local_build.py (make image-test, make image-test-gpu), without an engine: the local builds differ from the
release builds in cloudbuild.yaml only by the build arguments the issue allows, and bad input ends in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser

from tests.containers.engine import base, common, cuda, driver, engines, inputs, sizes, wheels
from tests.images.test_cloudbuild import build_steps, flag
from tests.images.test_dockerfiles import instructions

pytestmark = pytest.mark.images

ROOT = Path(__file__).resolve().parents[2]
# The only differences a local build may have: the base, its Python, and where torch's +cpu wheel and
# Horovod's wheel come from.
LOCAL_ONLY = {"CPU_IMAGE", "PYTHON_VERSION", "TORCH_CPU_INDEX_URL", "HOROVOD_WHEEL_URL"}
# The GPU variants: the CUDA bases replaced by the local Debian base (and Horovod's devel base by the local CUDA
# devel base), the GPU locks installed from PyPI as in the release.
LOCAL_ONLY_GPU = {"CUDA_IMAGE", "CUDA_DEVEL_IMAGE", "PYTHON_VERSION", "HOROVOD_WHEEL_URL"}
SOURCES = wheels.WheelSources("http://127.0.0.1:38417/simple/", "http://127.0.0.1:38417/horovod/")


def cloud_args(image: str, variant: str = "cpu") -> dict[str, str]:
    """The --build-arg values of cloudbuild.yaml's build step for ``image``'s ``variant``."""
    (step,) = [s for s in build_steps() if flag(s, "file") == [f"images/{image}/Dockerfile"]
               and f"VARIANT={variant}" in flag(s, "build-arg")]
    return dict(arg.split("=", 1) for arg in flag(step, "build-arg"))


def cloud_cpu_args(image: str) -> dict[str, str]:
    return cloud_args(image, "cpu")


def _git_head() -> str:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    return head.stdout.strip()


def dockerfile_args(image: str) -> set[str]:
    parser = DockerfileParser(str(ROOT / "images" / image / "Dockerfile"))
    return {ins["value"].split("=", 1)[0] for ins in parser.structure if ins["instruction"] == "ARG"}


@pytest.mark.parametrize("variant", common.VARIANTS)
@pytest.mark.parametrize("image", common.IMAGES)
def test_local_builds_pass_cloud_builds_arguments(image: str, variant: str) -> None:
    cloud, local = cloud_args(image, variant), driver.release_build_args(image, variant)
    assert set(local) == set(cloud)
    for name, value in cloud.items():
        if not value.startswith("${"):  # substitutions: the Makefile/driver fill in the same values
            assert local[name] == value, name
    # images.mk's IMAGE_VERSION and IMAGE_REVISION: the package version and the commit
    assert f'version = "{local["VERSION"]}"' in (ROOT / "pyproject.toml").read_text()
    assert local["REVISION"] in (_git_head(), "unknown")


@pytest.mark.parametrize("image", common.IMAGES)
@pytest.mark.parametrize("sources", [wheels.WheelSources(), SOURCES])
def test_everything_else_is_a_local_only_argument_the_dockerfile_declares(image: str, sources: Any) -> None:
    local = driver.local_build_args(image, sources)
    assert set(local) <= LOCAL_ONLY
    assert set(local) <= dockerfile_args(image)
    assert local["CPU_IMAGE"] == base.BASE_REF and local["PYTHON_VERSION"] == base.BASE_PYTHON
    # Horovod's wheel source goes to the one image that compiles Horovod, when there is one
    assert ("HOROVOD_WHEEL_URL" in local) == (image == "horovod" and sources.horovod_cache is not None)


@pytest.mark.parametrize("image", common.IMAGES)
@pytest.mark.parametrize("sources", [wheels.WheelSources(), SOURCES])
def test_gpu_builds_differ_only_by_their_bases(image: str, sources: Any) -> None:
    local = driver.local_build_args(image, sources, "gpu")
    assert set(local) <= LOCAL_ONLY_GPU
    assert set(local) <= dockerfile_args(image)
    assert local["CUDA_IMAGE"] == base.BASE_REF and local["PYTHON_VERSION"] == base.BASE_PYTHON
    # the devel base where the Dockerfile compiles (Horovod's NCCL operations), made from PyPI's CUDA wheels
    assert local.get("CUDA_DEVEL_IMAGE") == (cuda.CUDA_DEVEL_REF if image == "horovod" else None)
    command = driver.build_command(engines.Engine("podman", ("podman",)), image, sources, "gpu")
    assert f"--tag=localhost/trainer-{image}:gpu" in command and "--build-arg=VARIANT=gpu" in command


def test_the_cuda_devel_base_takes_the_gpu_locks_runtime_and_nccl() -> None:
    pins, dockerfile, digest = cuda.recipe()
    lock = (ROOT / "images" / "horovod" / "requirements.txt").read_text().splitlines()
    for name in cuda.FROM_LOCK:
        (pin,) = [p for p in pins if p.lower().startswith(f"{name}==")]
        assert pin in lock  # the headers and libraries of exactly what the image's torch loads
    assert all("==" in pin for pin in pins)  # exact pins only
    assert f"FROM {base.BASE_REF}\n" in dockerfile and f"{cuda.RECIPE_LABEL}={digest}" in dockerfile
    assert "libnccl-dev" in dockerfile  # what the Horovod Dockerfile's builder installs with apt-get
    assert "libnccl-dev" in (ROOT / "images" / "horovod" / "Dockerfile").read_text()


@pytest.mark.parametrize("image", common.IMAGES)
def test_images_built_side_by_side_serve_their_wheels_on_their_own_port(image: str) -> None:
    ports = {wheels.wheel_port(i) for i in common.IMAGES}
    assert len(ports) == len(common.IMAGES) and wheels.wheel_port(image) >= wheels.WHEEL_PORT


@pytest.mark.parametrize("image", common.IMAGES)
def test_build_command_uses_the_real_dockerfile_and_the_repository_context(image: str) -> None:
    engine = engines.Engine("podman", ("podman",))
    command = driver.build_command(engine, image, SOURCES)
    assert command[:2] == ["podman", "build"] and command[-1] == "."
    assert f"--file=images/{image}/Dockerfile" in command
    assert f"--tag=localhost/trainer-{image}:cpu" in command
    assert command[command.index("--format") + 1] == "docker"  # OCI format would drop SHELL (pipefail)
    build_args = {a.split("=", 2)[1] for a in command if a.startswith("--build-arg=")}
    assert build_args <= set(cloud_cpu_args(image)) | LOCAL_ONLY


@pytest.mark.parametrize("variant", common.VARIANTS)
def test_size_budget_covers_every_image_with_a_margin(variant: str) -> None:
    margin, budget = sizes.load_budget(variant)  # each images/<name>/image.toml's [size_budget]
    assert set(budget) == set(common.IMAGES)
    assert 0 < margin <= 0.25
    image, size = "pytorch", budget["pytorch"]
    assert sizes.budget_problem(image, size, variant) is None
    assert sizes.budget_problem(image, int(size * (1 + margin)) + 1, variant) is not None


def local_build(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "images" / "local_build.py"), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env}, check=False)


@pytest.mark.parametrize(("args", "env", "code"), [
    (["build", "nope"], {}, 1),
    (["build"], {"CONTAINER_ENGINE": "bogus"}, 1),
    (["engine"], {"CONTAINER_ENGINE": "bogus", "CI": "true"}, 1),
])
def test_bad_input_is_one_line_and_a_failure(args: list[str], env: dict[str, str], code: int) -> None:
    proc = local_build(*args, **env)
    assert proc.returncode == code
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("local_build: "), proc.stderr


def test_a_failed_build_names_an_unreachable_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "_reachable", lambda url: "timed out" if "pypi.org" in url else None)
    message = str(driver.diagnose("tensorflow", 1))
    assert "localhost/trainer-tensorflow:cpu" in message and "PyPI" in message and "unreachable" in message
    monkeypatch.setattr(driver, "_reachable", lambda url: None)
    assert "at the step shown above" in str(driver.diagnose("tensorflow", 1))


def test_the_base_is_refreshed_when_old_or_its_recipe_changes() -> None:
    recipe = base._recipe_hash()
    assert base.base_is_current(f"{recipe}-{_stamp(days_ago=1)}")
    assert not base.base_is_current(f"{recipe}-{_stamp(days_ago=base.BASE_MAX_AGE_DAYS + 1)}")
    assert not base.base_is_current(f"{'0' * 12}-{_stamp(days_ago=1)}")
    assert not base.base_is_current(None) and not base.base_is_current("unlabelled")


def _stamp(days_ago: float) -> str:
    from datetime import datetime, timedelta, timezone

    return (datetime.now(timezone.utc) - timedelta(days=days_ago)).strftime("%Y%m%dT%H%M%SZ")


def _context(root: Path) -> Path:
    (root / "entrypoint" / "__pycache__").mkdir(parents=True)
    (root / "entrypoint" / "cli.py").write_text("x = 1\n")
    (root / "entrypoint" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"compiled")
    (root / "pyproject.toml").write_text("[project]\n")
    (root / ".venv").mkdir()
    (root / ".venv" / "big").write_text("not in the context\n")
    (root / ".dockerignore").write_text("# allowlist\n*\n!pyproject.toml\n!entrypoint/\n**/__pycache__\n**/*.pyc\n")
    return root


def test_the_build_inputs_change_with_the_context_the_command_the_base_and_the_wheels(tmp_path: Path) -> None:
    """An image labelled with the digest of the inputs at hand is not built again: the digest must change with
    anything the build reads, and with nothing it does not."""
    root = _context(tmp_path / "repo")
    wheel = tmp_path / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"wheel")
    command, base_id = ["podman", "build", "--build-arg=VARIANT=cpu", "."], "sha256:base"
    first = inputs.digest(command, base_id, [wheel], root)
    assert first is not None and first == inputs.digest(command, base_id, [wheel], root)
    (root / ".venv" / "big").write_text("changed, but outside the context\n")
    (root / "entrypoint" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"recompiled")
    assert inputs.digest(command, base_id, [wheel], root) == first
    changes = [
        lambda: (root / "entrypoint" / "cli.py").write_text("x = 2\n"),
        lambda: (root / "entrypoint" / "new.py").write_text(""),
        lambda: (root / "entrypoint" / "new.py").chmod(0o755),
        lambda: (root / "pyproject.toml").write_text("[project]\nname = 'x'\n"),
        lambda: wheel.write_bytes(b"another wheel"),
    ]
    seen = {first}
    for change in changes:
        change()
        now = inputs.digest(command, base_id, [wheel], root)
        assert now not in seen
        seen.add(now)
    assert inputs.digest([*command[:-1], "--build-arg=VARIANT=gpu", "."], base_id, [wheel], root) not in seen
    assert inputs.digest(command, "sha256:another-base", [wheel], root) not in seen
    assert inputs.digest(command, None, [wheel], root) is None  # no base: always build
    revised = [*command[:-1], "--build-arg=REVISION=abc123", "."]
    assert inputs.digest(inputs.without_revision(revised), base_id, [wheel], root) == \
        inputs.digest(command, base_id, [wheel], root)  # a new commit with the same inputs builds nothing


def test_a_dockerignore_this_module_cannot_read_means_every_build_runs(tmp_path: Path) -> None:
    root = _context(tmp_path)
    (root / ".dockerignore").write_text(".venv\n.git\n")  # a denylist: the context is everything else
    assert inputs.context_roots(root) is None and inputs.digest(["build"], "base", [], root) is None
    (root / ".dockerignore").write_text("*\n!entrypoint/*.py\n")
    assert inputs.context_roots(root) is None


def test_the_repository_dockerignore_is_read_and_covers_what_the_dockerfiles_copy() -> None:
    roots = inputs.context_roots(ROOT)
    assert roots is not None
    copied = {src.split("/")[0] for image in common.IMAGES for ins in instructions(image)
              if ins["instruction"] == "COPY" and not ins["value"].startswith("--from=")
              for src in ins["value"].split()[:-1]}
    assert copied <= {p.name for p in roots}, copied


def test_an_image_is_current_only_while_its_tag_names_what_a_build_of_these_inputs_produced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ref = "localhost/trainer-pytorch:cpu"
    assert not inputs.is_current(ref, "sha256:a", "digest")  # never built here
    inputs.remember(ref, "sha256:a", "digest")
    assert inputs.is_current(ref, "sha256:a", "digest")
    assert not inputs.is_current(ref, "sha256:b", "digest")  # the tag names another image now
    assert not inputs.is_current(ref, "sha256:a", "other")  # the inputs changed
    assert not inputs.is_current("localhost/trainer-horovod:cpu", "sha256:a", "digest")
    next(inputs.record_dir().glob("*.json")).write_text("{not json")
    assert not inputs.is_current(ref, "sha256:a", "digest")  # a broken record: build


def test_the_shared_first_stage_is_built_once_with_an_image_builds_own_arguments(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`local_build.py base` builds the python-base stage before the images build side by side, with the build
    arguments of that image's own build (else the images' builds would not find its layers), tagging nothing."""
    seen: list[list[str]] = []
    run = subprocess.run
    monkeypatch.setattr(driver.subprocess, "run", lambda cmd, **kw: run(cmd, **kw) if cmd[0] == "git"
                        else seen.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    engine = engines.Engine("podman", ("podman",))
    driver.build_shared_stage(engine)
    (command,) = seen
    assert command[-2:] == [f"--target={driver.SHARED_STAGE}", "."]
    assert not [arg for arg in command if arg.startswith("--tag=")]
    image = next(arg for arg in command if arg.startswith("--file=")).split("/")[1]
    own = driver.build_command(engine, image, wheels.WheelSources())
    assert command[:-2] == [arg for arg in own if not arg.startswith("--tag=")][:-1]


def test_the_shared_first_stage_is_the_same_instructions_in_every_image() -> None:
    """Its layers are shared through the engine's cache only while every Dockerfile spells it the same."""
    def stage(image: str) -> list[tuple[str, str]]:
        found, inside = [], False
        for ins in DockerfileParser(str(ROOT / "images" / image / "Dockerfile")).structure:
            if ins["instruction"] == "FROM":
                inside = ins["value"].split()[-1] == driver.SHARED_STAGE
            elif inside and ins["instruction"] != "COMMENT":
                found.append((ins["instruction"], ins["value"]))
        return found
    first = stage(common.IMAGES[0])
    assert first and any("-m venv /opt/venv" in value for _, value in first)
    assert all(stage(image) == first for image in common.IMAGES)
