"""``tests.runs.replica_group``: the process group a test SIGKILLs as "the node" is the replica's entrypoint's (the
process ``local`` started), also when one of its ranks (a session leader of its own, as torch's agent and the fork
server start them) got a lower pid because pids wrapped (pid_max is 32768 here: a full run wraps them every few
minutes). Real processes; the wrap is made by moving the kernel's last pid up, then back (skipped where that is not
allowed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import cast

import pytest

from tests.conftest import subprocess_env
from tests.runs import MARKER_VARIABLE, Job, processes_with, replica_group

LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
# "local": its replica leads a session of its own; the replica starts a rank (a session of its own) once told to
LOCAL = """
import subprocess, sys, time
from pathlib import Path
replica = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True)
Path(sys.argv[2], "replica").write_text(str(replica.pid))
replica.wait()
"""
REPLICA = """
import subprocess, sys, time
from pathlib import Path
go = Path(sys.argv[1], "go")
while not go.exists():
    time.sleep(0.01)
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
Path(sys.argv[1], "rank").write_text(str(rank.pid))
rank.wait()
"""


class _Local:
    """What ``replica_group`` reads of a ``Job``: its marker, its process (``local``), what is left, its output."""

    def __init__(self, tmp: Path) -> None:
        self.marker = uuid.uuid4().hex
        env = subprocess_env({MARKER_VARIABLE: self.marker, "TRAINER_REPLICA": "workerpool1-0"})
        self.proc = subprocess.Popen([sys.executable, "-c", LOCAL, REPLICA, str(tmp)], env=env,
                                     start_new_session=True)

    def left(self) -> list[int]:
        return processes_with(self.marker)

    def output(self) -> str:
        return ""


def _read(path: Path, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path.name} never started"
        time.sleep(0.01)
    return int(path.read_text())


def test_the_replicas_group_is_its_entrypoints_when_a_rank_has_a_lower_pid(tmp_path: Path) -> None:
    if not os.access(LAST_PID, os.W_OK):
        pytest.skip("the kernel's last pid cannot be moved here (no CAP_SYS_ADMIN): pids cannot be made to wrap")
    LAST_PID.write_text("30000")  # "local" and its replica high, near pid_max (32768 here; more elsewhere)
    local = _Local(tmp_path)
    try:
        replica = _read(tmp_path / "replica")
        if replica < 2000:
            pytest.skip(f"the replica's pid ({replica}) leaves no room below it for a wrapped one")
        LAST_PID.write_text("300")  # the next pid the kernel gives (to the rank, unless another process is faster)
        (tmp_path / "go").touch()
        rank = _read(tmp_path / "rank")
        if rank > replica:
            pytest.skip(f"the rank's pid ({rank}) did not wrap below its replica's ({replica}): a busy machine")
        assert os.getpgid(rank) == rank  # a session leader of its own, with the replica's environment
        assert replica_group(cast(Job, local), "workerpool1-0") == replica
    finally:
        for pid in local.left():
            os.kill(pid, 9)
        local.proc.wait()
