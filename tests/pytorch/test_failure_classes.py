"""Failure classes from where a failure happened and its type, not from words in its message (issue 33).

A user's own ``RuntimeError("timed out waiting ...")`` is the user's error (1), not a lost peer (129, retried);
a chief port already in use is a port error; a corrupt size in the newest marker skips that checkpoint instead
of a permanent "disk full"; ``--timeout inf`` is a configuration error; a worker leaving early is named, not the
chief; a chief port that accepts connections but never answers fails the worker within its ``--timeout``.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from entrypoint.lifecycle.startup.ports import free_ports
from entrypoint.outputs import checkpoints
from tests.runs import Job, entrypoint, failure_records, failure_text, last_line

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
HERE = Path(__file__).resolve().parent


def run_args(job_dir: Path, *extra: str, module: str = "tests.pytorch.faults") -> list[str]:
    return ["run", "--framework", "pytorch", "--timeout", "30", "--grace-period", "10", "--job-dir", str(job_dir),
            "--module", module, "--log-every", "2", *extra]


def spec(task: str, chief_port: int, worker_port: int) -> str:
    cluster = {"workerpool0": [f"127.0.0.1:{chief_port}"], "workerpool1": [f"127.0.0.1:{worker_port}"]}
    return json.dumps({"cluster": cluster, "environment": "cloud", "task": {"type": task, "index": 0}})


@pytest.mark.parametrize("message", ["timed out waiting for x", "connection refused"])
def test_a_users_runtime_error_that_reads_like_a_network_error_is_user_code(tmp_path: Path, message: str) -> None:
    proc = entrypoint(*run_args(tmp_path, "--epochs", "1", module="tests.pytorch.raising_hooks"), "--",
                      f"--message={message}")
    assert proc.returncode == 1, failure_text(proc)
    assert "user_code" in last_line(proc) and message in last_line(proc), last_line(proc)
    assert [r["class"] for r in failure_records(tmp_path)] == ["user_code"]


def test_a_chief_port_already_in_use_is_a_clear_port_error(tmp_path: Path) -> None:
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen(8)
    port = taken.getsockname()[1]
    try:
        proc = entrypoint(*run_args(tmp_path, "--timeout", "10"),
                          env={"CLUSTER_SPEC": spec("workerpool0", port, free_ports(1)[0])}, timeout=120)
    finally:
        taken.close()
    line = last_line(proc)
    assert proc.returncode == 2, failure_text(proc)
    assert "peer_lost" not in line and f"port {port}" in line and "in use" in line, line


def test_a_corrupt_size_in_the_newest_marker_skips_that_checkpoint(tmp_path: Path) -> None:
    proc = entrypoint(*run_args(tmp_path, "--epochs", "1", "--checkpoint-every", "10"))
    assert proc.returncode == 0, failure_text(proc)
    (_, older), (_, newest) = checkpoints.committed(tmp_path / "checkpoints")[-2:]
    marker = newest / checkpoints.MARKER
    meta = json.loads(marker.read_text())
    meta["files"]["state.pt"]["size"] = 10**18  # a corrupt size (a flipped bit, a torn manifest)
    marker.write_text(json.dumps(meta))
    rerun = entrypoint(*run_args(tmp_path, "--epochs", "2", "--checkpoint-every", "10"))
    assert rerun.returncode == 0, failure_text(rerun)
    assert f"checkpoint {newest} does not load" in rerun.stdout
    assert f"resumed from {older}" in rerun.stdout


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_an_infinite_timeout_is_a_configuration_error(tmp_path: Path, value: str) -> None:
    proc = entrypoint(*run_args(tmp_path, "--epochs", "1"), "--timeout", value)
    assert proc.returncode == 2, failure_text(proc)
    assert "--timeout" in last_line(proc), last_line(proc)


@pytest.mark.parametrize("module", ["a..b", "/etc/passwd"])
def test_an_absurd_module_is_a_configuration_error(tmp_path: Path, module: str) -> None:
    proc = entrypoint("run", "--framework", "pytorch", "--job-dir", str(tmp_path), "--module", module)
    assert proc.returncode == 2, failure_text(proc)
    assert "config" in last_line(proc) and "--module" in last_line(proc), last_line(proc)


def test_a_workers_early_exit_in_script_mode_names_the_worker(tmp_path: Path) -> None:
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(tmp_path), "--restart-policy", "never", "--",
                      "run", "--framework", "pytorch", "--timeout", "10", "--grace-period", "10",
                      "--script", str(HERE / "early_exit_script.py"), timeout=180)
    line = last_line(proc)
    assert proc.returncode == 129, failure_text(proc)
    assert re.search(r"error: peer_lost on workerpool1-0, host .*workerpool1\[0\] .*left the job", line), line


class SilentListener:
    """A TCP port that accepts connections and never says a word (a frozen chief, a squatter)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)  # the kernel completes the handshakes; nobody ever accepts or answers
        self.port = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()


def test_a_chief_port_that_never_answers_fails_the_worker_within_its_timeout(tmp_path: Path) -> None:
    silent = SilentListener()
    job = Job(*run_args(tmp_path, "--timeout", "20"), env={"CLUSTER_SPEC": spec("workerpool1", silent.port,
                                                                                 free_ports(1)[0])})
    try:
        started = time.monotonic()
        try:
            code = job.wait(20 + 25)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the worker still waits {time.monotonic() - started:.0f} s after start with "
                                 f"--timeout 20:\n{job.output()[-2000:]}") from None
        line = last_line(job)
        assert code == 129, f"exit {code}: {line}"
        assert f"the chief workerpool0[0] (127.0.0.1:{silent.port})" in line and "20 s (--timeout)" in line, line
        assert "waiting for the chief workerpool0[0]" in job.output()  # said whom it waited for while waiting
    finally:
        job.cleanup()
        silent.close()
