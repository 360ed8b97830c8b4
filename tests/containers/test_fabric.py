"""The fabric step in a container of the CPU image (make image-test): fake host trees of A3 High, A3 Mega (GKE and
VM), A3 Ultra, A4 and a plain node (tests/fabric_trees.py) mounted at their real paths, as the recipes mount them.

``describe`` there (with ``CUDA_VISIBLE_DEVICES=0,...,7``, eight GPUs counted without a driver) shows for each
exactly the environment the fake profile exports, and ``doctor`` gives the expected verdicts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import fabric_trees
from tests.conftest import ROOT
from tests.containers.engine import OUT, Container, aip_dirs, run, writable_dir

pytestmark = pytest.mark.containers
# Where the recipes mount each piece (a directory of the tree that exists is mounted at its real path).
MOUNTS = ("/usr/local/gib", "/usr/local/nccl-plugin", "/var/lib/tcpxo", "/usr/local/nvidia/lib64", "/dev/infiniband",
          "/dev/aperture_devices", "/dev/dmabuf_import_helper")
EIGHT_GPUS = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "NCCL_NET": "gIB"}


def mounted(root: Path) -> dict[Path, str]:
    return {root / path.lstrip("/"): f"{path}:ro" for path in MOUNTS if (root / path.lstrip("/")).exists()}


def in_image(engine: Any, image: str, root: Path, *args: str) -> Any:
    return run(Container(engine, image, ["-m", "entrypoint", *args, "--framework", "pytorch"], env=EIGHT_GPUS,
                         entrypoint="python", volumes=mounted(root)))


@pytest.mark.parametrize("node", sorted(fabric_trees.NODES))
def test_describe_in_the_image_shows_exactly_what_the_mounted_profile_exports(
        engine: Any, built: Any, tmp_path: Path, node: str) -> None:
    root = fabric_trees.build(tmp_path / "node", node)
    proc = in_image(engine, built("pytorch"), root, "describe")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shown = json.loads(proc.stdout)
    view, fabric = shown["fabric"], fabric_trees.NODES[node][1]
    assert view["found"] == fabric and shown["plan"]["gpus_per_node"] == 8
    exported = {k: v for k, v in view["set"].items() if k != "LD_LIBRARY_PATH"}
    expected = {k: v for k, v in fabric_trees.expected_set(node).items() if k != "LD_LIBRARY_PATH"}
    if fabric == "gib":
        del expected["NCCL_NET"]  # the job's own gIB is the profile's: unchanged
    if "NCCL_FASTRAK_TEST_TOKEN" in expected:
        expected["NCCL_FASTRAK_TEST_TOKEN"] = "***"
    assert exported == expected
    if fabric is not None:
        assert view["set"]["LD_LIBRARY_PATH"].split(":")[0] == fabric_trees.NODES[node][2]
    assert sorted(view["removed"]) == ([] if fabric == "gib" else ["NCCL_NET"])


@pytest.mark.parametrize(("node", "verdicts"), [
    ("plain", {"fabric": "warning"}),  # the stray NCCL_NET=gIB
    ("a3high-gke", {"fabric": "warning", "fabric plugin": "warning"}),  # the fake plugin does not load
    ("a3mega-gke", {"fabric": "warning", "fabric plugin": "warning", "fabric devices": "ok", "glibc": "ok",
                    "fabric variables": "ok"}),
    ("a4", {"fabric": "ok", "fabric plugin": "warning", "libibverbs": "error", "fabric devices": "ok"}),
])
def test_doctor_in_the_image_gives_each_fabric_its_verdicts(
        engine: Any, built: Any, tmp_path: Path, node: str, verdicts: dict[str, str]) -> None:
    root = fabric_trees.build(tmp_path / "node", node)
    proc = in_image(engine, built("pytorch"), root, "doctor", "--json")
    checks = {c["check"]: c["status"] for c in json.loads(proc.stdout)["checks"] if c["check"] in FABRIC_CHECKS}
    assert checks == verdicts, proc.stdout[-3000:] + proc.stderr[-3000:]


FABRIC_CHECKS = ("fabric", "fabric plugin", "libibverbs", "fabric devices", "glibc", "fabric variables")


def test_run_in_the_image_gives_the_training_process_the_profiles_variables(
        engine: Any, built: Any, tmp_path: Path) -> None:
    """The image's own ENTRYPOINT (tini, python -m entrypoint run): the step, the exec once, the script sees it."""
    root = fabric_trees.build(tmp_path / "node", "a4")
    volume = writable_dir(tmp_path / "volume")
    job = Container(engine, built("pytorch"), ["--framework", "pytorch", "--script",
                                               "tests/pytorch/fabric_env_script.py", "--", f"{OUT}/seen"],
                    env={**aip_dirs(), "NCCL_TUNER_PLUGIN": "libnccl-tuner.so"},
                    volumes={**mounted(root), volume: OUT, ROOT / "tests": "/app/tests:ro"})
    proc = run(job)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = json.loads((volume / "seen.0").read_text())
    assert seen["NCCL_NET"] == "gIB" and seen["TRAINER_FABRIC_APPLIED"] == "1"
    assert seen["NCCL_TUNER_CONFIG_PATH"] == "/usr/local/gib/configs/tuner_config_a4.txtpb"
    assert seen["LD_LIBRARY_PATH"].split(":")[0] == "/usr/local/gib/lib64"
    assert "fabric: removed NCCL_TUNER_PLUGIN" in proc.stdout + proc.stderr
