"""doctor and the start-up preflight with real processes: this machine's real /dev/shm, a private 64 MiB one
(a mount namespace, as Docker's default), a read-only output mount, a missing socket interface; and the JSON
log lines every process of a run writes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from entrypoint.lifecycle.startup.ports import free_ports
from tests.conftest import PYTHON, ROOT, subprocess_env
from tests.pytorch.test_failures import mounted
from tests.runs import entrypoint, failure_records, failure_text, last_line

pytest.importorskip("torch")
pytestmark = pytest.mark.pytorch
FRAMEWORKS = ("torch", "tensorflow", "horovod", "keras")
LINE = re.compile(r"^(ok|warning|error|skipped) +([a-z]+(?: [a-z]+)*): \S")
TEXT_LOG = re.compile(r"^\d\d:\d\d:\d\d (?:\[rank \d+/\d+\] )?(INFO|WARNING|ERROR) ")
JSON_KEYS = {"severity", "message", "time", "logging.googleapis.com/labels", "logging.googleapis.com/sourceLocation"}


def vertex_pair() -> dict[str, str]:
    """The chief's CLUSTER_SPEC of a 2-replica Vertex job on free local ports (nobody else is started)."""
    chief, worker = free_ports(2)
    spec = {"cluster": {"workerpool0": [f"127.0.0.1:{chief}"], "workerpool1": [f"127.0.0.1:{worker}"]},
            "environment": "cloud", "task": {"type": "workerpool0", "index": 0}}
    return {"CLUSTER_SPEC": json.dumps(spec)}


def test_doctor_here_prints_one_line_a_check_and_imports_no_framework(tmp_path: Path) -> None:
    code = ("import sys; from entrypoint.cli import main; "
            f"rc = main(['doctor', '--framework', 'pytorch', '--job-dir', {str(tmp_path)!r}]); "
            f"bad = [m for m in {FRAMEWORKS!r} if m in sys.modules]; print('imported:', bad); sys.exit(rc)")
    proc = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, failure_text(proc)
    *lines, imported = proc.stdout.splitlines()
    assert imported == "imported: []"
    assert [LINE.match(line).group(2) for line in lines if LINE.match(line)] == [
        "framework", "shm", "driver", "gpus", "cpus", "network", "nofile", "memlock", "image", "peer snapshots",
        "outputs", "disk", "peers", "fabric"], \
        proc.stdout
    assert not list(tmp_path.iterdir())  # checking the outputs created nothing
    report = json.loads(entrypoint("doctor", "--framework", "pytorch", "--job-dir", str(tmp_path), "--json").stdout)
    assert report["exit_code"] == 0 and {c["status"] for c in report["checks"]} <= {"ok", "warning", "skipped"}


def test_doctor_names_a_read_only_output_mount_and_exits_73(tmp_path: Path) -> None:
    with mounted("ro", tmp_path / "readonly") as readonly:
        proc = entrypoint("doctor", "--framework", "pytorch", "--job-dir", str(tmp_path / "job"),
                          "--model-dir", str(readonly / "model"))
    assert proc.returncode == 73, failure_text(proc)
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("error")]
    assert line.startswith(f"error   outputs: model dir {readonly / 'model'}") and "fix: " in line


def test_a_missing_gloo_interface_ends_run_before_any_framework_starts(tmp_path: Path) -> None:
    env = {**vertex_pair(), "GLOO_SOCKET_IFNAME": "nosuch0"}
    doctor = entrypoint("doctor", "--framework", "pytorch", "--job-dir", str(tmp_path), env=env)
    assert doctor.returncode == 2 and "error   network: GLOO_SOCKET_IFNAME names nosuch0" in doctor.stdout
    proc = entrypoint("run", "--framework", "pytorch", "--module", "trainers.digits_torch", "--job-dir",
                      str(tmp_path), env=env, timeout=60)
    assert proc.returncode == 2, failure_text(proc)
    assert "waiting for" not in proc.stdout  # ended before the start-up barrier, let alone torch
    assert "GLOO_SOCKET_IFNAME names nosuch0" in last_line(proc) and last_line(proc).endswith("(exit 2, permanent)")
    (record,) = failure_records(tmp_path)
    assert record["class"] == "config"


@pytest.mark.slow
def test_run_caps_data_workers_to_a_64_mib_dev_shm_and_trains(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare to give the run a private /dev/shm")
    probe = subprocess.run(["unshare", "-m", "mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", "/dev/shm"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot mount a private /dev/shm here")
    command = (f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {PYTHON} -m entrypoint run --framework pytorch "
               f"--module tests.pytorch.loader_workers --job-dir {tmp_path} --data-workers 4 --log-every 10")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", command], cwd=ROOT, env=subprocess_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, failure_text(proc)
    (warning,) = [line for line in proc.stdout.splitlines() if "WARNING doctor: shm:" in line]
    assert "64 MiB free of 64 MiB (Docker's default)" in warning and "caps --data-workers at 1 (was 4)" in warning
    assert sorted(p.name for p in (tmp_path / "loader-workers").iterdir()) == ["0"]  # one worker read the data
    assert (tmp_path / "model" / "training_summary.json").is_file()


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_json_logs_from_the_node_and_its_workers_and_a_json_last_line(tmp_path: Path) -> None:
    proc = entrypoint("run", "--framework", "pytorch", "--module", "tests.pytorch.faults", "--job-dir", str(tmp_path),
                      "--nproc-per-node", "2", "--log-every", "1", "--log-format", "json", "--",
                      "--fault", "raise", "--at-step", "3", timeout=300)
    assert proc.returncode == 1, failure_text(proc)
    out, err = json_lines(proc.stdout), json_lines(proc.stderr)
    assert out and all(set(line) >= JSON_KEYS for line in out + err)
    assert not [line for line in (proc.stdout + proc.stderr).splitlines() if TEXT_LOG.match(line)]
    progress = [line for line in out if line["message"].startswith("epoch 1/")]
    assert progress and all(line["severity"] == "INFO" for line in progress)
    assert progress[-1]["logging.googleapis.com/labels"]["step"] == "2"
    assert {line["logging.googleapis.com/labels"].get("rank") for line in progress} == {"0"}
    assert progress[0]["logging.googleapis.com/sourceLocation"]["file"].endswith("pytorch/loop/trainer.py")
    *workers, _last = [line for line in err if line["severity"] == "ERROR"]
    assert workers and all(line["logging.googleapis.com/labels"]["rank"] in ("0", "1") for line in workers)
    last = json.loads(last_line(proc))
    assert last["severity"] == "ERROR" and last["message"].startswith("entrypoint: error: user_code on node-0, rank")
    assert "Traceback (most recent call last):" in proc.stderr  # the user's traceback passes through as it was
