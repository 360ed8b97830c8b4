"""``doctor``'s fabric checks (entrypoint/doctor/fabric.py) on the fake host trees of tests/fabric_trees.py."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from entrypoint.doctor import fabric as doctor_fabric
from tests import fabric_trees

BASE = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def verdicts(root: Path, mode: str = "auto", **env: str) -> dict[str, str]:
    found = doctor_fabric.findings(doctor_fabric.facts(mode, {**BASE, **env}, str(root), load=True))
    return {f.check: f.status for f in found}


def test_a_plain_node_is_ok_and_a_stray_is_a_warning(tmp_path: Path) -> None:
    root = fabric_trees.build(tmp_path, "plain")
    assert verdicts(root) == {"fabric": "ok"}
    assert verdicts(root, NCCL_NET="gIB") == {"fabric": "warning"}
    assert verdicts(root, "off", NCCL_NET="gIB") == {"fabric": "skipped"}
    assert verdicts(root, "gib") == {"fabric": "error"}


def test_the_fabric_line_names_the_nccl_that_training_loads(tmp_path: Path) -> None:
    """On an H200 doctor named the driver, the GPUs and the fabric but no NCCL: the line says which core runs."""
    found = doctor_fabric.facts("auto", BASE, str(fabric_trees.build(tmp_path / "plain", "plain")), load=False)
    assert found.step is not None
    step = dataclasses.replace(found.step, image_nccl="2.28.9 (nvidia-nccl-cu13)")
    (line,) = doctor_fabric.findings(dataclasses.replace(found, step=step))
    assert line.message == "none found: NCCL's own transports; NCCL 2.28.9 (nvidia-nccl-cu13)"
    (line,) = doctor_fabric.findings(dataclasses.replace(found, step=dataclasses.replace(step, image_nccl=None)))
    assert line.message == "none found: NCCL's own transports; no NCCL wheel in this image"
    gib = doctor_fabric.facts("auto", BASE, str(fabric_trees.build(tmp_path / "a4", "a4")), load=False)
    assert gib.step is not None
    step = dataclasses.replace(gib.step, host_nccl="2.21.5", image_nccl="2.28.9 (nvidia-nccl-cu13)")
    line = doctor_fabric.findings(dataclasses.replace(gib, step=step))[0]
    assert "NCCL 2.21.5 from /usr/local/gib/lib64 (the image's: 2.28.9 (nvidia-nccl-cu13))" in line.message


def test_gib_without_libibverbs_is_an_error_and_with_it_ok(tmp_path: Path) -> None:
    root = fabric_trees.build(tmp_path, "a3ultra")
    found = verdicts(root)
    # The fake plugin is an empty file: it does not load (a warning naming why), and the tree has no libibverbs.
    assert found == {"fabric": "ok", "fabric plugin": "warning", "libibverbs": "error", "fabric devices": "ok"}
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (root / "usr/lib/x86_64-linux-gnu/libibverbs.so.1").write_text("")
    (root / "dev/infiniband").rmdir()
    assert verdicts(root) == {"fabric": "ok"}  # gIB's packages without RDMA NICs (an image built with GIB=1)
    (root / "sys/class/infiniband/mlx5_0").mkdir(parents=True)  # the NICs are there, their devices not mounted
    assert verdicts(root) == {"fabric": "ok", "fabric plugin": "warning", "libibverbs": "ok",
                              "fabric devices": "error"}


@pytest.mark.parametrize("node", ["a3mega-gke", "a3mega-vm"])
def test_tcpxo_needs_its_devices_glibc_and_the_checkers_variables(tmp_path: Path, node: str) -> None:
    root = fabric_trees.build(tmp_path, node)
    found = verdicts(root)
    assert found["fabric"] == "ok" and found["fabric variables"] == "ok"
    assert found["glibc"] == ("ok" if doctor_fabric._glibc() >= doctor_fabric.MIN_TCPXO_GLIBC else "error")
    assert found["fabric devices"] == "ok"
    (root / "dev/aperture_devices").rmdir()
    assert verdicts(root)["fabric devices"] == "error"
    profile = next(root.rglob("nccl-env-profile.sh"))
    profile.write_text(profile.read_text().replace("export NCCL_NVLSTREE_MAX_CHUNKSIZE=131072\n", ""))
    assert verdicts(root)["fabric variables"] == "error"


def test_a_plugin_that_loads_is_ok(tmp_path: Path) -> None:
    root = fabric_trees.build(tmp_path, "a3high-gke")
    libc = next(p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6")
                if os.path.exists(p))
    plugin = root / "usr/local/nvidia/lib64/libnccl-net.so"
    plugin.unlink()
    plugin.symlink_to(libc)
    found = doctor_fabric.findings(doctor_fabric.facts("auto", BASE, str(root), load=True))
    assert [(f.check, f.status) for f in found] == [("fabric", "ok"), ("fabric plugin", "ok")]
    assert found[1].message.endswith("libnccl-net.so loads")


def test_a_bad_profile_is_a_warning_naming_it(tmp_path: Path) -> None:
    root = fabric_trees.build(tmp_path, "a4")
    (root / "usr/local/gib/scripts/set_nccl_env.sh").write_text("exit 1\n")
    found = doctor_fabric.findings(doctor_fabric.facts("auto", BASE, str(root), load=False))
    assert [f.status for f in found] == ["warning"] and "set_nccl_env.sh" in found[0].message


def test_a_stray_beside_a_fabric_is_a_warning(tmp_path: Path) -> None:
    root = fabric_trees.build(tmp_path, "a3mega-gke")
    assert verdicts(root, NCCL_NET="gIB")["fabric"] == "warning"
