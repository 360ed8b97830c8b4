"""`local`'s replica disks: a SIGKILLed `local` leaves its disks root, and the next `local` removes it once its owner is
surely gone (this host and pid namespace, its pid gone or reused); nothing else (no process started but `true`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from entrypoint.local import emulator
from entrypoint.local.emulator import DISKS_PREFIX, OWNER, Disks, owner_gone, remove_stale


def root_owned_by(temp: Path, name: str, **changes: object) -> Path:
    root = temp / f"{DISKS_PREFIX}{name}"
    (root / "workerpool0-0" / "tmp").mkdir(parents=True)
    (root / OWNER).write_text(json.dumps({**emulator._owner(os.getpid()), **changes}))
    return root


@pytest.fixture
def gone_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_the_disks_of_a_gone_local_are_removed_and_no_others(tmp_path: Path, gone_pid: int) -> None:
    mine = root_owned_by(tmp_path, "mine")  # a live local: this process
    gone = root_owned_by(tmp_path, "gone", pid=gone_pid, started=0)
    reused = root_owned_by(tmp_path, "reused", started=1)  # this pid, but a process started at another tick
    other_host = root_owned_by(tmp_path, "host", pid=gone_pid, host="another-host")
    other_ns = root_owned_by(tmp_path, "ns", pid=gone_pid, pidns="pid:[1]")  # that pid means nothing here
    rebooted = root_owned_by(tmp_path, "boot", pid=os.getpid(), pidns="pid:[1]", boot="an-earlier-boot")
    unowned = tmp_path / f"{DISKS_PREFIX}unowned"  # being made, or an older version's
    unowned.mkdir()
    torn = root_owned_by(tmp_path, "torn")
    (torn / OWNER).write_text("{")
    metrics = tmp_path / f"{DISKS_PREFIX}1-{gone_pid}"  # a local's tuning metrics (remote outputs): not disks
    (metrics / ".replicas").mkdir(parents=True)
    assert not owner_gone(mine)
    assert sorted(remove_stale(tmp_path)) == sorted([gone, reused, rebooted])
    assert all(p.is_dir() for p in (mine, other_host, other_ns, unowned, torn, metrics))
    assert not any(p.exists() for p in (gone, reused, rebooted))


def test_disks_name_their_owner_and_remove_a_stale_root_as_they_start(tmp_path: Path, gone_pid: int,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    stale = root_owned_by(tmp_path, "stale", pid=gone_pid, started=0)
    disks = Disks(tmp_path / "source")
    try:
        assert not stale.exists() and disks.root.parent == tmp_path
        owner = json.loads((disks.root / OWNER).read_text())
        assert owner["pid"] == os.getpid() and not owner_gone(disks.root)
    finally:
        disks.remove()
