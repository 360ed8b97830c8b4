"""images/local_build.py (make image-test), without an engine: the local CPU builds differ from the release
builds in cloudbuild.yaml only by the build arguments the issue allows, and bad input ends in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser

from tests.containers.engine import base, common, driver, engines, sizes, wheels
from tests.images.test_cloudbuild import build_steps, flag

pytestmark = pytest.mark.images

ROOT = Path(__file__).resolve().parents[2]
# The only differences a local build may have: the base, its Python, and where torch's +cpu wheel and
# Horovod's wheel come from.
LOCAL_ONLY = {"CPU_IMAGE", "PYTHON_VERSION", "TORCH_CPU_INDEX_URL", "HOROVOD_WHEEL_URL"}
SOURCES = wheels.WheelSources("http://127.0.0.1:38417/simple/", "http://127.0.0.1:38417/horovod/")


def cloud_cpu_args(image: str) -> dict[str, str]:
    """The --build-arg values of cloudbuild.yaml's CPU build step for ``image``."""
    (step,) = [s for s in build_steps() if flag(s, "file") == [f"images/{image}/Dockerfile"]
               and "VARIANT=cpu" in flag(s, "build-arg")]
    return dict(arg.split("=", 1) for arg in flag(step, "build-arg"))


def _git_head() -> str:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    return head.stdout.strip()


def dockerfile_args(image: str) -> set[str]:
    parser = DockerfileParser(str(ROOT / "images" / image / "Dockerfile"))
    return {ins["value"].split("=", 1)[0] for ins in parser.structure if ins["instruction"] == "ARG"}


@pytest.mark.parametrize("image", common.IMAGES)
def test_local_builds_pass_cloud_builds_cpu_arguments(image: str) -> None:
    cloud, local = cloud_cpu_args(image), driver.release_build_args(image)
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
def test_build_command_uses_the_real_dockerfile_and_the_repository_context(image: str) -> None:
    engine = engines.Engine("podman", ("podman",))
    command = driver.build_command(engine, image, SOURCES)
    assert command[:2] == ["podman", "build"] and command[-1] == "."
    assert f"--file=images/{image}/Dockerfile" in command
    assert f"--tag=localhost/trainer-{image}:cpu" in command
    assert command[command.index("--format") + 1] == "docker"  # OCI format would drop SHELL (pipefail)
    build_args = {a.split("=", 2)[1] for a in command if a.startswith("--build-arg=")}
    assert build_args <= set(cloud_cpu_args(image)) | LOCAL_ONLY


def test_size_budget_covers_every_image_with_a_margin() -> None:
    data: dict[str, Any] = json.loads(sizes.BUDGET_FILE.read_text())
    assert set(data["bytes"]) == set(common.IMAGES)
    assert 0 < data["margin"] <= 0.25
    margin, budget = sizes.load_budget()
    image, size = "pytorch", budget["pytorch"]
    assert sizes.budget_problem(image, size) is None
    assert sizes.budget_problem(image, int(size * (1 + margin)) + 1) is not None


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
