"""An image is one folder: a toy image folder and a toy framework package plus its registry line, added to a copy of
the checkout, are picked up by the Make targets and test tiers (``make -n``), by the Cloud Build file's generator and
by ``describe``, with no other edit (images/catalog.py reads every images/<name>/image.toml)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.containers.engine import catalog

pytestmark = pytest.mark.images

TOY_SPEC = """\
framework = "toy"
smoke_module = "trainers.toy_example"
build_checks = ["entrypoint describe"]

[size_budget]
cpu = 100000000
gpu = 200000000

[tests]
marker = "toy"
workers = 3
containers = "toy"

[venv]
over = "pytorch"
"""
TOY_FRAMEWORK = '''"""A toy framework: one process, nothing to set up."""

from entrypoint.planning.registry import Framework, NodePlan


def plan(topo, options, user_set, gpus, outputs):
    return NodePlan(strategy="toy", reason="a toy runs one process", nproc_per_node=1)


FRAMEWORK = Framework(name="toy", probe="json", strategies=("default", "toy"), plan=plan,
                      launcher="entrypoint.toy.launch:launch", title="Toy", chosen_alone=False, image="toy",
                      cuda_major=13)
'''
REGISTRY_LINE = '    "toy": "entrypoint.toy.framework",\n'


def checkout_copy(where: Path) -> Path:
    """What make, the generator and describe read: the Makefile, the image folders, the package, the requirements."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(ROOT / name, where / name)
    for folder in ("images", "entrypoint", "trainers"):
        shutil.copytree(ROOT / folder, where / folder, ignore=skip)
    (where / "tests").mkdir()
    for name in ("requirements.txt", "requirements-jobs.txt"):
        shutil.copy2(ROOT / "tests" / name, where / "tests" / name)
    return where


def add_toy(copy: Path) -> None:
    """The toy image's folder, the toy framework's package and its registry line: nothing else."""
    folder = copy / "images" / "toy"
    folder.mkdir()
    (folder / "Dockerfile").write_text("FROM debian:bookworm\n")
    (folder / "requirements-cpu.txt").write_text("# the toy's CPU lock\n")
    (folder / "requirements.txt").write_text("# the toy's GPU lock\n")
    (folder / catalog.SPEC).write_text(TOY_SPEC)
    package = copy / "entrypoint" / "toy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "framework.py").write_text(TOY_FRAMEWORK)
    registry = copy / "entrypoint" / "planning" / "registry.py"
    text = registry.read_text()
    anchor = 'REGISTRY: dict[str, str] = {\n'
    assert anchor in text
    registry.write_text(text.replace(anchor, anchor + REGISTRY_LINE, 1))


def make_dry_run(copy: Path, *targets: str) -> str:
    """``make -n`` of the targets, with the tier wrapper and recursive makes replaced by echo (nothing runs)."""
    proc = subprocess.run(["make", "--no-print-directory", "-n", f"VENV_DIR={copy / 'venvs'}",
                           f"LOG_DIR={copy / 'logs'}", "TIER=echo", "MAKE=true", *targets], cwd=copy,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def toy_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = checkout_copy(tmp_path_factory.mktemp("checkout"))
    add_toy(copy)
    return copy


def test_the_catalog_reads_the_toy_folder(toy_checkout: Path) -> None:
    proc = subprocess.run([sys.executable, "images/catalog.py", "check"], cwd=toy_checkout, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    names = sorted([*(image.name for image in catalog.images()), "toy"])  # the checkout's images and the toy
    assert proc.stdout.strip().endswith(f"{len(names)} images: {', '.join(names)}")


def test_make_gets_the_toys_venv_tier_image_build_and_container_tier(toy_checkout: Path) -> None:
    venvs = toy_checkout / "venvs"
    out = make_dry_run(toy_checkout, "test-tiers", "build-toy-cpu")
    assert f"-m venv {venvs}/toy" in out
    pip = f"{venvs}/toy/bin/pip --disable-pip-version-check"
    assert "_over_pytorch.pth" in out  # [venv] over: the toy's venv sits over the PyTorch one
    assert f"{pip} install -q -r images/toy/requirements-cpu.txt\n" in out
    assert f'echo toy -- {venvs}/toy/bin/python -m pytest -m "toy" -n 3 --maxschedchunk 1' in out
    assert "echo image-toy -- python3 images/local_build.py build toy" in out
    assert '-k "toy"' in out and "echo containers-toy --" in out  # its own container tier
    own_tiers = sorted({i.name for i in catalog.images() if i.containers != catalog.DEFAULT_GROUP} | {"toy"})
    assert f'-k "not ({" or ".join(own_tiers)})"' in out  # and the default container tier leaves its tests to it
    others = [i.marker for i in catalog.images() if not i.catch_all] + ["toy"]
    catch_all = " and ".join(f"not {marker}" for marker in others)
    assert f'-m "{catch_all} and not jobs and not containers"' in out  # the catch-all tier claims no other tier's
    assert "--file images/toy/Dockerfile --build-arg VARIANT=cpu" in out and "toy-cpu:dev" in out


def test_the_horovod_venv_sits_over_two_venvs_and_its_image_builds_after_the_one_it_starts_from(
        toy_checkout: Path) -> None:
    """[venv] over with two images: a .pth file for each (the PyTorch stack and TensorFlow installed once for the
    three venvs); build_after: the TensorFlow image is built before the Horovod one, whose CPU builder starts from its
    layers (docs/images.md)."""
    venvs = toy_checkout / "venvs"
    out = make_dry_run(toy_checkout, "image-horovod")
    for base in ("tensorflow", "pytorch"):
        assert f"{venvs}/{base}/bin/python -c" in out and f"/_over_{base}.pth" in out
    own = out[out.index(f"-m venv {venvs}/horovod"):]
    assert own.count("_over_") == 2 and f"{venvs}/horovod/bin/pip --disable-pip-version-check install -q -r " \
        "images/horovod/requirements-cpu.txt" in own
    tensorflow = out.index("echo image-tensorflow -- python3 images/local_build.py build tensorflow")
    assert tensorflow < out.index("echo image-horovod -- python3 images/local_build.py build horovod")


def test_the_cloud_build_file_gets_the_toys_builds_self_tests_and_push(toy_checkout: Path) -> None:
    proc = subprocess.run([sys.executable, "images/catalog.py", "cloudbuild"], cwd=toy_checkout, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    config = __import__("yaml").safe_load(proc.stdout)
    ids = {step["id"] for step in config["steps"]}
    assert {"build-toy", "build-toy-cpu", "test-toy", "test-toy-cpu"} <= ids
    assert "entrypoint describe --module trainers.toy_example" in proc.stdout
    assert "${_REGION}-docker.pkg.dev/$PROJECT_ID/${_REPOSITORY}/toy-cpu:${_TAG}" in config["images"]


def test_describe_plans_the_toy_framework(toy_checkout: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("CLUSTER_SPEC", "TF_CONFIG")}
    env["PYTHONPATH"] = str(toy_checkout)
    proc = subprocess.run([sys.executable, "-m", "entrypoint", "describe", "--framework", "toy", "--module",
                           "trainers.digits_torch"], cwd=toy_checkout, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads(proc.stdout)["plan"]
    assert (plan["framework"], plan["strategy"]) == ("toy", "toy")


def test_this_checkouts_images_are_the_catalogs() -> None:
    """No image is known anywhere but in its folder: the catalog lists exactly the folders with a Dockerfile."""
    assert [image.name for image in catalog.images()] == sorted(
        p.parent.name for p in (ROOT / "images").glob("*/Dockerfile"))
