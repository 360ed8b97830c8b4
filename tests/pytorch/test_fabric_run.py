"""The fabric step in a real ``run``: on a fake A4 tree (tests/fabric_trees.py) the training processes see what
the host's profile exports and the plugin directory first on LD_LIBRARY_PATH, the node's own process too (the
entrypoint starts itself again once, so the dynamic loader reads it); on a plain node a stray NCCL_NET=gIB
never reaches them, unless --fabric off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import fabric_trees
from tests.runs import entrypoint, failure_text

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
SCRIPT = "tests/pytorch/fabric_env_script.py"


def seen(tmp_path: Path, node: str, *flags: str, nproc: str = "1", **env: str) -> tuple[list[dict[str, str]], str]:
    root = fabric_trees.build(tmp_path / "node", node)
    out = tmp_path / "seen"
    proc = entrypoint("run", "--framework", "pytorch", "--timeout", "120", "--job-dir", str(tmp_path / "job"),
                      "--nproc-per-node", nproc, *flags, "--script", SCRIPT, "--", str(out),
                      env={"TRAINER_FABRIC_ROOT": str(root), "LD_LIBRARY_PATH": "/opt/image/lib", **env})
    assert proc.returncode == 0, failure_text(proc)
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("seen.*"))], proc.stdout + proc.stderr


@pytest.mark.parametrize("nproc", ["1", "2"], ids=["in-process", "torch-agent"])
def test_the_training_processes_get_the_profiles_variables_and_the_plugin_first(tmp_path: Path, nproc: str) -> None:
    found, log = seen(tmp_path, "a4", nproc=nproc)
    assert len(found) == int(nproc)
    for process in found:
        assert process["NCCL_NET"] == "gIB" and process["NCCL_CROSS_NIC"] == "0"
        assert process["NCCL_TUNER_CONFIG_PATH"] == "/usr/local/gib/configs/tuner_config_a4.txtpb"
        assert process["LD_LIBRARY_PATH"] == "/usr/local/gib/lib64:/opt/image/lib"
        assert process["TRAINER_FABRIC_APPLIED"] == "1"  # started again once, before anything loaded NCCL
    assert log.count("fabric: gib (A3 Ultra, A4)") == 1 and "starts again with the plugin's directory" in log


def test_a_stray_gib_never_reaches_training_on_a_plain_node(tmp_path: Path) -> None:
    (process,), log = seen(tmp_path, "plain", NCCL_NET="gIB")
    assert process["NCCL_NET"] is None and process["TRAINER_FABRIC_APPLIED"] is None
    assert "fabric: removed NCCL_NET: names the gIB plugin" in log


def test_fabric_off_passes_the_environment_on(tmp_path: Path) -> None:
    (process,), _ = seen(tmp_path, "a4", "--fabric", "off", NCCL_NET="gIB")
    assert process["NCCL_NET"] == "gIB" and process["LD_LIBRARY_PATH"] == "/opt/image/lib"
