"""cloudbuild.yaml: a consistent build graph that builds, self-tests and pushes every image variant."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.images

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "cloudbuild.yaml").read_text()
CONFIG: dict[str, Any] = yaml.safe_load(TEXT)
STEPS: list[dict[str, Any]] = CONFIG["steps"]
IMAGES = sorted(p.parent.name for p in (ROOT / "images").glob("*/Dockerfile"))
# Substitutions Cloud Build itself provides (https://cloud.google.com/build/docs/configuring-builds/substitute-variable-values).
BUILT_IN = {"PROJECT_ID", "PROJECT_NUMBER", "BUILD_ID", "LOCATION", "COMMIT_SHA", "SHORT_SHA", "REVISION_ID",
            "BRANCH_NAME", "TAG_NAME", "REPO_NAME", "REPO_FULL_NAME", "TRIGGER_NAME", "SERVICE_ACCOUNT"}


def flag(step: dict[str, Any], name: str) -> list[str]:
    """Values of ``--name=value`` / ``--name value`` in a step's args."""
    args = [str(a) for a in step.get("args", [])]
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    values += [args[i + 1] for i, a in enumerate(args[:-1]) if a == f"--{name}"]
    return values


def build_steps() -> list[dict[str, Any]]:
    return [s for s in STEPS if s.get("args") and s["args"][0] == "build"]


def built_tags() -> set[str]:
    return {tag for step in build_steps() for tag in flag(step, "tag") + flag(step, "t")}


def test_every_step_has_a_unique_id() -> None:
    ids = [s.get("id") for s in STEPS]
    assert all(ids) and len(ids) == len(set(ids))


def test_every_wait_for_names_an_earlier_step() -> None:
    earlier: set[str] = set()
    for step in STEPS:
        for dep in step.get("waitFor", []):
            assert dep == "-" or dep in earlier, f"{step['id']} waits for unknown/later step {dep!r}"
        earlier.add(step["id"])


def test_builds_start_at_once_and_everything_else_has_an_explicit_wait() -> None:
    for step in STEPS:
        assert "waitFor" in step, step["id"]
    for step in build_steps():
        assert step["waitFor"] == ["-"], step["id"]


def test_every_image_is_built_in_both_variants_from_an_existing_dockerfile() -> None:
    built = set()
    for step in build_steps():
        (dockerfile,) = flag(step, "file")
        assert (ROOT / dockerfile).is_file(), dockerfile
        (variant,) = [a.split("=", 1)[1] for a in flag(step, "build-arg") if a.startswith("VARIANT=")]
        built.add((Path(dockerfile).parent.name, variant))
        assert step["args"][-1] == ".", "the build context is the repository root"
    assert built == {(image, variant) for image in IMAGES for variant in ("gpu", "cpu")}


def test_every_built_image_is_self_tested_after_its_build() -> None:
    for build in build_steps():
        (tag,) = flag(build, "tag")
        tests = [s for s in STEPS if build["id"] in s.get("waitFor", []) and tag in str(s.get("args"))]
        assert tests, f"nothing runs {tag}"
        assert any("docker run" in str(s["args"]) and "entrypoint describe" in str(s["args"]) for s in tests)


def test_every_pushed_image_is_built_by_a_step() -> None:
    pushed = list(CONFIG.get("images", []))
    pushed += [s["args"][1] for s in STEPS if s.get("args", [None])[0] == "push"]
    assert pushed
    assert set(pushed) <= built_tags()
    assert set(CONFIG["images"]) == built_tags()  # and everything built is released


def test_images_go_to_artifact_registry() -> None:
    registry = re.escape("${_REGION}-docker.pkg.dev/$PROJECT_ID/${_REPOSITORY}/")
    for tag in built_tags():
        assert re.fullmatch(registry + r"[a-z-]+:" + re.escape("${_TAG}"), tag), tag


def test_every_substitution_used_is_defined_and_every_one_defined_is_used() -> None:
    body = "\n".join(line.split("#", 1)[0] for line in TEXT.splitlines())  # comments are not config
    used = set(re.findall(r"\$\{?(_[A-Z0-9_]+)\}?", body))
    defined = set(CONFIG["substitutions"])
    assert used - defined == set()
    assert defined - used == set()  # Cloud Build rejects unused substitutions
    others = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)\}?", body))
    assert others <= BUILT_IN, others - BUILT_IN


def test_machine_disk_and_timeout() -> None:
    assert CONFIG["options"]["machineType"] == "E2_HIGHCPU_32"
    assert int(CONFIG["options"]["diskSizeGb"]) >= 100
    assert re.fullmatch(r"\d+s", CONFIG["timeout"])


def test_the_makefile_builds_the_same_images() -> None:
    """images/images.mk mirrors cloudbuild.yaml: same (Dockerfile, variant, repository) triples (``make -n build``
    prints the builds it generates for every images/<name>/Dockerfile)."""
    dry = subprocess.run(["make", "--no-print-directory", "-n", "-f", "images/images.mk", "build", "REGISTRY=r",
                          "TAG=t", "IMAGE_VERSION=0", "IMAGE_REVISION=0"], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=60)
    local = set(re.findall(r"--file images/(\w+)/Dockerfile --build-arg VARIANT=(\w+) .* --tag r/([\w-]+):t",
                           dry.stdout))
    cloud = set()
    for step in build_steps():
        (dockerfile,) = flag(step, "file")
        (variant,) = [a.split("=", 1)[1] for a in flag(step, "build-arg") if a.startswith("VARIANT=")]
        (tag,) = flag(step, "tag")
        cloud.add((Path(dockerfile).parent.name, variant, tag.rsplit("/", 1)[1].split(":")[0]))
    assert local == cloud
