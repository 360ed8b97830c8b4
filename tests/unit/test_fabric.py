"""The GPU fabric step (entrypoint/cluster/fabric.py, docs/fabric.md) on fake host trees laid out as Google's
recipes mount them (tests/fabric_trees.py): found, its profile's exports passed on exactly, strays removed,
bad profiles, ``--fabric``, and ``describe``."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from entrypoint.cluster import fabric
from entrypoint.errors import ConfigError
from tests import fabric_trees
from tests.conftest import PYTHON, ROOT, subprocess_env

BASE = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}


@pytest.mark.parametrize("node", sorted(fabric_trees.NODES))
def test_each_node_gets_exactly_what_its_profile_exports(tmp_path: Path, node: str) -> None:
    root = fabric_trees.build(tmp_path, node)
    step = fabric.prepare("auto", BASE, str(root))
    _, found, plugin_dir, _ = fabric_trees.NODES[node]
    assert step.fabric == found and step.problem is None
    assert step.set == fabric_trees.expected_set(node, BASE["LD_LIBRARY_PATH"]
                                                 if plugin_dir != BASE["LD_LIBRARY_PATH"] else "")
    assert step.removed == {} and step.kept == ()
    env = dict(BASE)  # apply says whether the library path changed (a running process must start again to see it)
    assert fabric.apply(step, env) == (env["LD_LIBRARY_PATH"] != BASE["LD_LIBRARY_PATH"])


def test_a_stray_gib_on_a_plain_node_is_removed_by_name(tmp_path: Path) -> None:
    root = fabric_trees.build(tmp_path, "plain")
    env = {**BASE, "NCCL_NET": "gIB", "NCCL_TUNER_CONFIG_PATH": "/usr/local/gib/configs/tuner_config_a4.txtpb",
           "NCCL_TUNER_PLUGIN": "libnccl-tuner.so", "NCCL_DEBUG": "INFO"}
    step = fabric.prepare("auto", env, str(root))
    assert step.fabric is None and step.set == {}
    assert sorted(step.removed) == ["NCCL_NET", "NCCL_TUNER_CONFIG_PATH", "NCCL_TUNER_PLUGIN"]
    assert fabric.apply(step, env) is False  # the library path is as it was
    assert "NCCL_NET" not in env and env["NCCL_DEBUG"] == "INFO"
    lines = "\n".join(step.lines())
    assert "removed NCCL_NET" in lines and "tuner_config_a4" not in lines  # names, never values


def test_gib_on_a_gib_node_is_not_a_stray(tmp_path: Path) -> None:
    root = fabric_trees.build(tmp_path, "a4")
    step = fabric.prepare("auto", {**BASE, "NCCL_NET": "gIB"}, str(root))
    assert step.removed == {} and step.kept == ()  # the same value: nothing kept, nothing changed


def test_the_users_own_values_win_over_the_profiles(tmp_path: Path) -> None:
    root = fabric_trees.build(tmp_path, "a3ultra")
    step = fabric.prepare("auto", {**BASE, "NCCL_CROSS_NIC": "1"}, str(root))
    assert "NCCL_CROSS_NIC" not in step.set and step.kept == ("NCCL_CROSS_NIC",)
    assert step.set["NCCL_NET"] == "gIB"


def test_off_leaves_the_environment_alone(tmp_path: Path) -> None:
    root = fabric_trees.build(tmp_path, "plain")
    step = fabric.prepare("off", {**BASE, "NCCL_NET": "gIB"}, str(root))
    assert step.set == {} and step.removed == {}


@pytest.mark.parametrize(("text", "why"), [
    ("exit 3\n", "ended the shell"),
    ("false\n", "failed (status 1)"),
    ("sleep 600 &\nsleep 600\n", "did not finish within"),
    # more than a process can be started with (E2BIG): the second dump could not run, and nothing was passed on
    ("export NCCL_HUGE=$(head -c 200000 /dev/zero | tr '\\0' x)\n",
     "exports more than a process can be started with (NCCL_HUGE is 200011 bytes, a variable holds at most 131072)"),
    ("for i in $(seq 30); do export NCCL_BIG_$i=$(head -c 100000 /dev/zero | tr '\\0' y); done\n",
     "exports more than a process can be started with (its variables come to "),
], ids=["exits", "fails", "hangs", "a-variable-too-large", "too-large-together"])
def test_a_bad_profile_is_one_line_and_auto_goes_on_without_the_fabric(tmp_path: Path, text: str,
                                                                       why: str) -> None:
    root = fabric_trees.build(tmp_path, "a3ultra")
    (root / "usr/local/gib/scripts/set_nccl_env.sh").write_text("export NCCL_NET=gIB\n" + text)
    started = time.monotonic()
    step = fabric.prepare("auto", BASE, str(root), timeout=2.0)
    assert time.monotonic() - started < 60  # the hung profile's children were killed with it
    assert step.problem and why in step.problem and "/usr/local/gib/scripts/set_nccl_env.sh" in step.problem
    assert step.fabric is None and step.set == {}
    with pytest.raises(ConfigError, match=r"set_nccl_env\.sh"):
        fabric.prepare("gib", BASE, str(root), timeout=2.0)


def test_garbage_a_profile_prints_is_discarded(tmp_path: Path) -> None:
    root = fabric_trees.build(tmp_path, "a4")
    profile = root / "usr/local/gib/scripts/set_nccl_env.sh"
    profile.write_text("printf 'X=1\\0\\377garbage\\0'\nprintf 'junk' >&2\n" + profile.read_text())
    assert fabric.prepare("auto", BASE, str(root)).set == fabric_trees.expected_set("a4", BASE["LD_LIBRARY_PATH"])


def test_an_explicit_fabric_that_is_not_there_is_a_configuration_error(tmp_path: Path) -> None:
    root = fabric_trees.build(tmp_path, "a3mega-vm")
    with pytest.raises(ConfigError, match="gib asked for, but this node has no gib plugin"):
        fabric.prepare("gib", BASE, str(root))
    assert fabric.prepare("tcpxo", BASE, str(root)).fabric == "tcpxo"


def test_a_bad_trainer_fabric_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match="TRAINER_FABRIC: must be one of"):
        fabric.mode_of(None, "rdma")
    assert fabric.mode_of("off", "gib") == "off" and fabric.mode_of(None, None) == "auto"


def test_the_users_nccl_lib_dir_is_looked_in_first(tmp_path: Path) -> None:
    root = fabric_trees.build(tmp_path, "a3mega-vm")
    fabric_trees.build(tmp_path, "a3mega-gke")
    step = fabric.prepare("auto", {**BASE, "NCCL_LIB_DIR": "/var/lib/tcpxo/lib64"}, str(root))
    assert step.layout is not None and step.layout.plugin_dir == "/var/lib/tcpxo/lib64"
    assert "NCCL_LIB_DIR" not in step.set


def describe(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "entrypoint", "describe", "--framework", "pytorch", *args],
                          env=subprocess_env({"TRAINER_FABRIC_ROOT": str(root), "LD_LIBRARY_PATH": "",
                                              "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", **env}),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("node", ["a3mega-gke", "a4", "plain"])
def test_describe_shows_exactly_what_the_profile_exports(tmp_path: Path, node: str) -> None:
    root = fabric_trees.build(tmp_path, node)
    done = describe(root, NCCL_NET="gIB")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    expected = fabric_trees.expected_set(node)
    if node == "a4":
        del expected["NCCL_NET"]  # the user's gIB is the profile's: unchanged, so not set
    if "NCCL_FASTRAK_TEST_TOKEN" in expected:
        expected["NCCL_FASTRAK_TEST_TOKEN"] = "***"  # a secret-like name's value is never printed
    view = shown["fabric"]
    assert view["found"] == fabric_trees.NODES[node][1] and view["set"] == expected
    assert sorted(view["removed"]) == ([] if node == "a4" else ["NCCL_NET"])
    assert view["kept_user_values"] == []
    assert shown["plan"]["gpus_per_node"] == 8
    assert "fake-token-value" not in done.stdout + done.stderr


def test_describe_with_an_explicit_fabric_that_is_not_there_exits_2(tmp_path: Path) -> None:
    done = describe(fabric_trees.build(tmp_path, "plain"), "--fabric", "tcpxo")
    assert done.returncode == 2 and "tcpxo asked for" in done.stderr.strip().splitlines()[-1]


def test_run_node_applies_the_step_to_the_environment_training_inherits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from types import SimpleNamespace

    from entrypoint.lifecycle import runner
    from entrypoint.options import RunOptions

    root = fabric_trees.build(tmp_path, "plain")
    monkeypatch.setenv("TRAINER_FABRIC_ROOT", str(root))
    monkeypatch.setenv("NCCL_NET", "gIB")
    caplog.set_level("INFO", logger="entrypoint")
    runner.prepare_fabric(SimpleNamespace(options=RunOptions()))  # type: ignore[arg-type]
    assert "NCCL_NET" not in os.environ
    assert "fabric: removed NCCL_NET: names the gIB plugin" in caplog.text
    monkeypatch.setenv("NCCL_NET", "gIB")
    runner.prepare_fabric(SimpleNamespace(options=RunOptions(fabric="off")))  # type: ignore[arg-type]
    assert os.environ["NCCL_NET"] == "gIB"


def test_run_starts_itself_again_when_the_library_path_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dynamic loader reads LD_LIBRARY_PATH only at a process's start: the entrypoint execs itself once."""
    import sys
    from types import SimpleNamespace

    from entrypoint.lifecycle import runner
    from entrypoint.options import RunOptions

    class Exec(Exception):
        pass

    def fake_execv(path: str, argv: list[str]) -> None:
        raise Exec(path, argv)

    root = fabric_trees.build(tmp_path, "a4")
    monkeypatch.setenv("TRAINER_FABRIC_ROOT", str(root))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64")
    monkeypatch.delenv("TRAINER_FABRIC_APPLIED", raising=False)
    for name in fabric_trees.gib_exports("a4"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "execv", fake_execv)
    plan = SimpleNamespace(options=RunOptions())
    with pytest.raises(Exec) as started:
        runner.prepare_fabric(plan)  # type: ignore[arg-type]
    assert started.value.args == (sys.executable, [sys.executable, *sys.orig_argv[1:]])
    assert os.environ["LD_LIBRARY_PATH"] == "/usr/local/gib/lib64:/usr/local/nvidia/lib64"
    assert os.environ["NCCL_NET"] == "gIB" and os.environ["TRAINER_FABRIC_APPLIED"] == "1"
    assert runner.prepare_fabric(plan).mode == "applied"  # type: ignore[arg-type]  # started again: no second step


def test_both_nccl_cores_are_named(tmp_path: Path) -> None:
    root = fabric_trees.build(tmp_path, "a3ultra")
    lib = root / "usr/local/gib/lib64"
    (lib / "libnccl.so.2.27.7").write_text("")
    (lib / "libnccl.so.2").symlink_to("libnccl.so.2.27.7")
    step = fabric.prepare("auto", BASE, str(root))
    assert step.host_nccl == "2.27.7" and step.describe()["nccl"] == {"plugin_dir": "2.27.7",
                                                                       "image": fabric.image_nccl()}
    assert any("NCCL core in /usr/local/gib/lib64: 2.27.7" in line for line in step.lines())
    assert fabric.prepare("auto", BASE, str(fabric_trees.build(tmp_path / "a4", "a4"))).host_nccl is None


def test_gib_packages_in_the_image_on_a_node_without_rdma_are_not_used(tmp_path: Path) -> None:
    """An image built with GIB=1 carries /usr/local/gib; a node without RDMA devices has no gIB fabric."""
    root = fabric_trees.build(tmp_path, "a4")
    (root / "dev/infiniband").rmdir()
    step = fabric.prepare("auto", {**BASE, "NCCL_NET": "gIB"}, str(root))
    assert step.fabric is None and step.set == {} and list(step.removed) == ["NCCL_NET"]
    assert "the gib plugin (/usr/local/gib/scripts/set_nccl_env.sh) is here, but none of" in step.lines()[0]
    (root / "sys/class/infiniband/mlx5_0").mkdir(parents=True)  # the RDMA NICs as sysfs lists them
    assert fabric.prepare("auto", BASE, str(root)).fabric == "gib"


def test_a_plugin_in_the_nvidia_lib64_of_an_rdma_node_is_not_tcpx(tmp_path: Path) -> None:
    """GKE's gIB installer DaemonSet copies its lib64 into the host's nvidia lib64 too: without the /usr/local/gib
    volume mounted, that node has no fabric the step can set up, not TCPX."""
    root = fabric_trees.build(tmp_path, "a3high-gke")
    assert fabric.prepare("auto", BASE, str(root)).fabric == "tcpx"
    (root / "sys/class/infiniband/mlx5_0").mkdir(parents=True)
    assert fabric.prepare("auto", BASE, str(root)).fabric is None


def test_without_bash_the_profile_is_a_bad_one(tmp_path: Path) -> None:
    root = fabric_trees.build(tmp_path, "a4")
    step = fabric.prepare("auto", {**BASE, "PATH": str(tmp_path / "nowhere")}, str(root))
    assert step.problem is not None and "bash could not start" in step.problem and step.fabric is None
