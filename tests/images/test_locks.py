"""The exact requirement locks, images/<name>/requirements.txt (GPU) and requirements-cpu.txt (CPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from tests.containers.engine import common

pytestmark = pytest.mark.images

ROOT = Path(__file__).resolve().parents[2]
IMAGES = common.IMAGES  # images/<name>/Dockerfile
LOCKS = sorted((ROOT / "images").glob("*/requirements*.txt"))
PIN = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[A-Za-z0-9.+!_-]+)")
OPTION = re.compile(r"--extra-index-url \S+")


def pins(lock: Path) -> dict[str, str]:
    """Canonical package name -> pinned version (assumes the format test below passes)."""
    found: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        match = PIN.fullmatch(line.strip())
        if match:
            found[canonicalize_name(match["name"])] = match["version"]
    return found


def lock(image: str, variant: str) -> dict[str, str]:
    return pins(ROOT / "images" / image / ("requirements-cpu.txt" if variant == "cpu" else "requirements.txt"))


def test_every_image_has_both_locks() -> None:
    assert {f"{p.parent.name}/{p.name}" for p in LOCKS} == {
        f"{image}/{name}" for image in IMAGES for name in ("requirements.txt", "requirements-cpu.txt")
    }


@pytest.mark.parametrize("path", LOCKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_line_is_an_exact_pin_comment_or_index(path: Path) -> None:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if text and not text.startswith("#"):
            assert PIN.fullmatch(text) or OPTION.fullmatch(text), f"{path.name}:{number}: {line!r}"


@pytest.mark.parametrize("path", LOCKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_package_is_pinned_twice(path: Path) -> None:
    names = [canonicalize_name(m["name"]) for line in path.read_text().splitlines()
             if (m := PIN.fullmatch(line.strip()))]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


@pytest.mark.parametrize("image", IMAGES)
def test_gpu_lock_is_the_cpu_lock_plus_cuda_packages(image: str) -> None:
    """Same versions for every shared package; the GPU lock drops nothing the CPU one has.

    Exception: the Horovod CPU variant also ships TensorFlow (Horovod's TF ops are built only there,
    see docs/horovod.md), so its TensorFlow-lock packages are absent from the GPU lock.
    """
    cpu, gpu = lock(image, "cpu"), lock(image, "gpu")
    if image == "horovod":
        tf_only = set(lock("tensorflow", "cpu")) - set(lock("pytorch", "cpu"))
        cpu = {n: v for n, v in cpu.items() if n not in tf_only}
    assert {n: v for n, v in cpu.items() if gpu.get(n) != v} == {}


@pytest.mark.parametrize("image", IMAGES)
def test_gpu_lock_pins_the_nccl_runtime_and_cpu_lock_has_no_cuda(image: str) -> None:
    assert [n for n in lock(image, "gpu") if re.fullmatch(r"nvidia-nccl-cu\d+", n)]
    assert [n for n in lock(image, "cpu") if n.startswith(("nvidia-", "cuda-", "triton"))] == []


def test_all_images_agree_on_shared_packages() -> None:
    seen: dict[str, tuple[str, str]] = {}
    for path in LOCKS:
        for name, version in pins(path).items():
            where = f"{path.parent.name}/{path.name}"
            first = seen.setdefault(name, (version, where))
            assert first[0] == version, f"{name}: {first[0]} in {first[1]}, {version} in {where}"


@pytest.mark.parametrize("image", ["pytorch", "horovod"])
@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_torch_is_2_13_0(image: str, variant: str) -> None:
    assert lock(image, variant)["torch"] == "2.13.0"


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_horovod_lock_is_the_pytorch_lock_plus_horovods_requirements(variant: str) -> None:
    horovod, pytorch = lock("horovod", variant), lock("pytorch", variant)
    assert {n: v for n, v in pytorch.items() if horovod.get(n) != v} == {}
    for requirement in ("cloudpickle", "psutil", "pyyaml", "packaging", "cffi"):
        assert requirement in horovod, requirement
    assert "horovod" not in horovod  # built from source by the Dockerfile, installed --no-deps


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_tensorflow_lock(variant: str) -> None:
    tf = lock("tensorflow", variant)
    assert tf["tensorflow"] == "2.21.0" and tf["tf-keras"] == "2.21.0"
    assert "tensorflow-cpu" not in tf  # tf-keras requires `tensorflow`: both would be installed
    assert tf["cloudml-hypertune"] == "0.1.0.dev6"


# torchvision's release for each torch release (its wheel's metadata requires exactly that torch).
TORCHVISION_FOR_TORCH = {"2.13.0": "0.28.0"}


@pytest.mark.parametrize("image", ["pytorch", "horovod"])
def test_gpu_locks_ship_the_torchvision_matched_to_their_torch(image: str) -> None:
    gpu = lock(image, "gpu")
    assert gpu["torchvision"] == TORCHVISION_FOR_TORCH[gpu["torch"]]


@pytest.mark.parametrize("image", ["pytorch", "horovod"])
def test_cpu_locks_have_no_torchvision_nor_torchaudio(image: str) -> None:
    """PyPI's torchvision is a CUDA build that does not import against torch's +cpu build, and no torchaudio
    release is built for torch 2.13 (docs/images.md, "torchvision, torchaudio, TensorBoard")."""
    assert {"torchvision", "torchaudio"} & set(lock(image, "cpu")) == set()
    assert "torchaudio" not in lock(image, "gpu")


@pytest.mark.parametrize("image", ["pytorch", "horovod"])
@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_torch_images_ship_both_tensorboard_writers(image: str, variant: str) -> None:
    found = lock(image, variant)
    assert found["tensorboard"] == "2.21.0" and found["tensorboardx"] == "2.6.5"
