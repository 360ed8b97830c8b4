"""Whose job dir it is (``lease.py``) and what it last ran with (``jobrecord.py``): on a disk and on gs://.

Real processes stand in for other holders (a live one, a dead one); another host's holder is a lease written with
that host's name. No framework.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from entrypoint.errors import ConfigError
from entrypoint.lifecycle import jobrecord, lease
from entrypoint.lifecycle.lease import LEASE, Holder, JobLease
from entrypoint.options import RunOptions
from entrypoint.outputs import storage
from tests.gcs import BUCKET, Emulator


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease, "RENEW", 0.2)
    monkeypatch.setattr(lease, "STALE", 1.0)
    monkeypatch.setattr(lease, "_POLL", 0.05)


@pytest.fixture
def process() -> Iterator[subprocess.Popen[bytes]]:
    """Another live process of this host."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def holder_of(job_dir: Path, pid: int, host: str, job: str | None = None) -> Holder:
    """A lease as that process (on that host) wrote it."""
    found = Holder("t" * 32, job, host, pid, lease.start_ticks(pid), time.time())
    found.write(storage.path(job_dir) / LEASE)
    return found


def test_a_job_holds_its_dir_and_leaves_it_free(tmp_path: Path) -> None:
    with JobLease(str(tmp_path), None) as held:
        assert Holder.read(tmp_path / LEASE) == held.me
        time.sleep(0.5)
        assert Holder.read(tmp_path / LEASE).renewals > 0  # type: ignore[union-attr]
    assert not (tmp_path / LEASE).exists()
    JobLease(str(tmp_path), None).acquire().release()  # the next job takes it at once


def test_a_live_job_of_this_host_is_refused_at_once(tmp_path: Path, process: subprocess.Popen[bytes]) -> None:
    import socket

    holder_of(tmp_path, process.pid, socket.gethostname())
    started = time.monotonic()
    with pytest.raises(ConfigError, match=rf"^--job-dir: {tmp_path} is in use by another live job \(pid "
                                          rf"{process.pid} on host "):
        JobLease(str(tmp_path), None).acquire()
    assert time.monotonic() - started < 0.5


def test_a_dead_holder_of_this_host_leaves_nothing_stuck(tmp_path: Path) -> None:
    import socket

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    holder_of(tmp_path, gone.pid, socket.gethostname())
    started = time.monotonic()
    JobLease(str(tmp_path), None).acquire().release()
    assert time.monotonic() - started < 0.5


def test_the_same_jobs_next_attempt_takes_over_at_once(tmp_path: Path, process: subprocess.Popen[bytes]) -> None:
    """The platform restarts the job (same cluster, same trial): its previous attempt's lease is no refusal."""
    holder_of(tmp_path, process.pid, "another-host", job="vertex:chief:2222:-")
    with JobLease(str(tmp_path), "vertex:chief:2222:-") as held:
        assert Holder.read(tmp_path / LEASE) == held.me


def test_another_hosts_holder_is_watched(tmp_path: Path) -> None:
    """Renewed while watched: a live job, refused. Not renewed for STALE seconds: gone, taken over."""
    stale = holder_of(tmp_path, 1, "another-host")
    started = time.monotonic()
    with JobLease(str(tmp_path), None):
        assert 1.0 <= time.monotonic() - started < 3
    stale.write(tmp_path / LEASE)
    stop = threading.Event()

    def renew() -> None:
        current = stale
        while not stop.wait(0.2):
            current = replace(current, renewals=current.renewals + 1)
            current.write(tmp_path / LEASE)

    renewing = threading.Thread(target=renew)
    renewing.start()
    try:
        with pytest.raises(ConfigError, match="in use by another live job"):
            JobLease(str(tmp_path), None).acquire()
    finally:
        stop.set()
        renewing.join()


def test_a_lease_on_a_bucket(emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on gs:// (the GCS emulator): held, refused to another job of another host, released."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.host)
    monkeypatch.setattr(storage, "_filesystems", {})
    job_dir = f"gs://{BUCKET}/lease/job"
    with JobLease(job_dir, "local:127.0.0.1:1:-"):
        assert Holder.read(storage.path(job_dir) / LEASE) is not None
        with pytest.raises(ConfigError, match="in use by another live job"):
            JobLease(job_dir, "local:127.0.0.1:2:-", host="another-host").acquire()
    assert not (storage.path(job_dir) / LEASE).exists()


def test_a_rerun_with_other_arguments_says_which_and_what_resuming_means(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = RunOptions(module="trainer.task", epochs=2, user_args=("--lr", "0.1", "--token", "s3cret-value"))
    record = jobrecord.start(str(tmp_path), first, frozenset({"s3cret-value"}))
    assert "s3cret" not in (tmp_path / jobrecord.RECORD).read_text()
    jobrecord.finished(str(tmp_path), record)
    caplog.set_level("INFO", logger="entrypoint")
    again = RunOptions(module="trainer.task", epochs=1, user_args=("--lr=0.01", "--token", "rotated-value", "--fp16"))
    jobrecord.start(str(tmp_path), again, frozenset({"rotated-value"}))
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "this run's arguments differ from the job's last run: --epochs 2 -> 1; --fp16 (after --) not given -> " \
           "given; --lr (after --) 0.1 -> 0.01." in line
    assert "--token" not in line  # a rotated secret is no difference (both are ***)
    assert "The job finished there" in line and "optimizer state" in line
    caplog.clear()
    jobrecord.start(str(tmp_path), again, frozenset({"rotated-value"}))  # the platform's restart: same arguments
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert json.loads((tmp_path / jobrecord.RECORD).read_text())["finished"] is False


def test_a_holder_that_is_a_zombie_is_gone(tmp_path: Path) -> None:
    """A chief SIGKILLed with its supervisor stays a zombie until someone reaps it: it holds nothing."""
    import socket

    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    while lease._stat(zombie.pid)[:1] != ["Z"]:
        time.sleep(0.05)
    holder_of(tmp_path, zombie.pid, socket.gethostname())
    JobLease(str(tmp_path), None).acquire().release()
    zombie.wait()
