"""Exit 142: a peer that passed the start-up barrier but never starts TensorFlow ends the chief at --timeout.

TensorFlow holds the GIL while it waits, so the record and the last line come from the watcher process.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from entrypoint.failures.records import read_records
from entrypoint.lifecycle.startup.ports import free_ports
from tests.conftest import PYTHON, ROOT, subprocess_env
from tests.tensorflow.runs import TOY, run_args

pytestmark = pytest.mark.tensorflow


def join_barrier(port: int, key: str, member: int, deadline: float) -> socket.socket:
    """Play a worker at the start-up barrier (then never start TensorFlow); the open connection."""
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=2)
        except OSError:
            time.sleep(0.2)
            continue
        sock.sendall(f"TRAINER-BARRIER/1 {key} {member}\n".encode())
        sock.settimeout(60)
        assert sock.recv(16).startswith(b"GO")
        return sock
    raise AssertionError("the chief never opened the barrier")


def test_a_peer_lost_after_the_barrier_ends_tensorflows_start_at_the_timeout(tmp_path: Path) -> None:
    chief, worker = free_ports(2)
    tf_config = {"cluster": {"chief": [f"127.0.0.1:{chief}"], "worker": [f"127.0.0.1:{worker}"]},
                 "task": {"type": "chief", "index": 0}}
    command = [PYTHON, "-m", "entrypoint", *run_args("--module", TOY, "--job-dir", str(tmp_path), "--timeout", "5")]
    proc = subprocess.Popen(command, cwd=ROOT, env=subprocess_env({"TF_CONFIG": json.dumps(tf_config)}),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        peer = join_barrier(chief, f"2@127.0.0.1:{chief}", 1, time.monotonic() + 60)
        released = time.monotonic()
        output, _ = proc.communicate(timeout=120)
        peer.close()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGALRM, output[-3000:]  # the shell and `local` report 142: retryable
    # Ended by the deadline, not by a wait of TensorFlow's own; loose, as under a suite's load (12 on 2 cores) this
    # took 45 s, mostly the chief's TensorFlow import: the SIGALRM exit and the record's --timeout prove the deadline.
    assert time.monotonic() - released < 5 + 90
    assert f"worker[0] (127.0.0.1:{worker})" in output and "exit code 142" in output
    last = output.strip().splitlines()[-1]
    assert last.startswith("entrypoint: error: peer_lost on chief-0"), output[-3000:]
    assert f"worker[0] (127.0.0.1:{worker})" in last and last.endswith("(exit 142, retryable)"), last
    [record] = read_records(str(tmp_path), 0)
    assert record.exit_code == 142 and record.pid == proc.pid and "--timeout 5 s" in record.message
