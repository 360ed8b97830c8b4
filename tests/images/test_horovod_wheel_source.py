"""build_horovod_wheel.sh takes a served wheel (HOROVOD_WHEEL_URL, as `make image-test` serves the host's wheel
cache) only when its key material is exactly this build's: Horovod compiles once per key, never a wrong wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.containers.engine import wheels

pytestmark = pytest.mark.images

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "images" / "horovod" / "build_horovod_wheel.sh"


def script(out: Path, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The script for this venv's torch (PyTorch ops only), with an empty local cache and no package index
    (a fallback to the source build fails at once instead of downloading)."""
    empty = tmp / "empty"
    empty.mkdir(exist_ok=True)
    child = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    child.update(TRAINER_WHEEL_CACHE=str(tmp / "local-cache"), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(empty),
                 PIP_CONFIG_FILE=os.devnull, **env)
    return subprocess.run(["bash", str(SCRIPT), sys.executable, str(out)], capture_output=True, text=True,
                          env=child, timeout=300, check=False)


def served_cache(tmp: Path, material: str, key: str) -> Path:
    """A wheel cache as the script writes it: <key>/key.txt and a wheel with the torch extension."""
    folder = tmp / "cache" / key
    folder.mkdir(parents=True)
    (folder / "key.txt").write_text(material + "\n")
    with zipfile.ZipFile(folder / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl", "w") as wheel:
        wheel.writestr("horovod/torch/mpi_lib_v2.cpython-311-x86_64-linux-gnu.so", b"\x7fELF")
    return tmp / "cache"


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    tmp = tmp_path_factory.mktemp("key")
    proc = script(tmp / "out", tmp, HOROVOD_KEY_ONLY="1")
    assert proc.returncode == 0, proc.stderr
    name, material = proc.stdout.splitlines()
    return name, material


def test_a_wheel_served_for_this_key_is_used_instead_of_compiling(tmp_path: Path, key: tuple[str, str]) -> None:
    name, material = key
    cache = served_cache(tmp_path, material, name)
    with wheels.wheel_index(None, cache, port=0) as sources:  # any free port: never the builds' own
        proc = script(tmp_path / "out", tmp_path, HOROVOD_WHEEL_URL=str(sources.horovod_cache))
    assert proc.returncode == 0, proc.stderr
    assert "served for this key" in proc.stdout
    (wheel,) = (tmp_path / "out").glob("horovod-*.whl")
    assert wheel.read_bytes() == (cache / name / wheel.name).read_bytes()


@pytest.mark.parametrize("tamper", ["other key material", "no extension"])
def test_anything_else_falls_back_to_the_source_build(tmp_path: Path, key: tuple[str, str], tamper: str) -> None:
    name, material = key
    cache = served_cache(tmp_path, material.replace("patch=", "patch=old-") if tamper != "no extension" else material,
                         name)
    if tamper == "no extension":
        (wheel,) = (cache / name).glob("*.whl")
        with zipfile.ZipFile(wheel, "w") as empty:
            empty.writestr("horovod/__init__.py", "")
    with wheels.wheel_index(None, cache, port=0) as sources:  # any free port: never the builds' own
        proc = script(tmp_path / "out", tmp_path, HOROVOD_WHEEL_URL=str(sources.horovod_cache))
    # The fallback is the source build, which needs the sdist: no index here, so it stops there.
    assert proc.returncode != 0
    assert "building from source" in proc.stderr
    assert ("served key differs" in proc.stderr) == (tamper == "other key material")
    assert not list((tmp_path / "out").glob("horovod-*.whl"))


def test_an_unreachable_source_falls_back_too(tmp_path: Path) -> None:
    proc = script(tmp_path / "out", tmp_path, HOROVOD_WHEEL_URL="http://127.0.0.1:9/horovod/")
    assert proc.returncode != 0 and "building from source" in proc.stderr
