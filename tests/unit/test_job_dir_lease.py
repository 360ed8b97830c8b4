"""Whose job dir it is (``lease.py``) and what it last ran with (``jobrecord.py``): on a disk and on gs://.

Real processes stand in for other holders (a live one, a dead one, one in another pid namespace: ``unshare``);
another host's holder is a lease written with that host's name. No framework.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from entrypoint.errors import ConfigError
from entrypoint.lifecycle.jobdir import jobrecord, lease
from entrypoint.lifecycle.jobdir.lease import LEASE, Holder, JobLease
from entrypoint.options import RunOptions
from entrypoint.outputs import storage
from tests.conftest import ROOT, subprocess_env
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
    """A lease as that process (on that host; in this pid namespace when on this host) wrote it."""
    here = host == socket.gethostname()
    found = Holder("t" * 32, job, host, pid, lease.start_ticks(pid), time.time(),
                   pidns=lease.pid_namespace() if here else "pid:[1]", boot=lease.boot_id() if here else "b")
    found.write(storage.path(job_dir) / LEASE)
    return found


def aged(path: Path, seconds: float) -> None:
    """The file as last written ``seconds`` ago."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_job_holds_its_dir_and_leaves_it_free(tmp_path: Path) -> None:
    with JobLease(str(tmp_path), None) as held:
        assert Holder.read(tmp_path / LEASE) == held.me
        deadline = time.monotonic() + 30  # renewed every 0.2 s here: an event, waited for on a loaded machine
        while Holder.read(tmp_path / LEASE).renewals == 0 and time.monotonic() < deadline:  # type: ignore[union-attr]
            time.sleep(0.05)
        assert Holder.read(tmp_path / LEASE).renewals > 0  # type: ignore[union-attr]
    assert not (tmp_path / LEASE).exists()
    JobLease(str(tmp_path), None).acquire().release()  # the next job takes it at once


def test_a_live_job_of_this_host_is_refused_at_once(tmp_path: Path, process: subprocess.Popen[bytes],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    holder_of(tmp_path, process.pid, socket.gethostname())
    monkeypatch.setattr(lease.time, "sleep", no_sleep)  # at once: nothing watched
    with pytest.raises(ConfigError, match=rf"^--job-dir: {tmp_path} is in use by another live job \(pid "
                                          rf"{process.pid} on host "):
        JobLease(str(tmp_path), None).acquire()


def test_a_dead_holder_of_this_host_leaves_nothing_stuck(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    holder_of(tmp_path, gone.pid, socket.gethostname())
    monkeypatch.setattr(lease.time, "sleep", no_sleep)  # at once: nothing watched
    taken_by(tmp_path)


def test_the_same_jobs_next_attempt_takes_over_once_the_lease_is_stale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The platform restarts the job (same cluster, same trial) on another VM: its previous attempt's lease, last
    written STALE ago, is taken over at once (nothing watched). The same identity still renewing elsewhere (one
    CLUSTER_SPEC started twice) is a live job: refused, saying so."""
    holder_of(tmp_path, 1, "another-host", job="vertex:chief:2222:-")
    aged(tmp_path / LEASE, lease.STALE + 1)
    monkeypatch.setattr(lease.time, "sleep", no_sleep)
    with JobLease(str(tmp_path), "vertex:chief:2222:-") as held:
        assert Holder.read(tmp_path / LEASE) == held.me
    monkeypatch.setattr(lease.time, "sleep", SLEEP)
    with renewing(holder_of(tmp_path, 1, "another-host", job="vertex:chief:2222:-"), tmp_path / LEASE), \
            pytest.raises(ConfigError, match=r"in use by another live job with this job's own identity"):
        JobLease(str(tmp_path), "vertex:chief:2222:-").acquire()


SLEEP = time.sleep


def taken_by(job_dir: Path) -> None:
    """A new job takes the dir: its lease is the one there until it releases it, which leaves none."""
    held = JobLease(str(job_dir), None).acquire()
    assert Holder.read(job_dir / LEASE) == held.me
    held.release()
    assert not (job_dir / LEASE).exists()


def no_sleep(seconds: float) -> None:
    raise AssertionError(f"slept {seconds} s")


@contextlib.contextmanager
def renewing(holder: Holder, path: Path) -> Iterator[None]:
    """Another job renewing its lease every 0.2 s while the block runs."""
    stop = threading.Event()

    def renew() -> None:
        current = holder
        while not stop.wait(0.2):
            current = replace(current, renewals=current.renewals + 1)
            current.write(path)

    thread = threading.Thread(target=renew)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_another_hosts_holder_is_watched(tmp_path: Path) -> None:
    """Renewed while watched: a live job, refused. Not renewed for STALE seconds: gone, taken over."""
    stale = holder_of(tmp_path, 1, "another-host")
    started = time.monotonic()
    with JobLease(str(tmp_path), None):
        assert time.monotonic() - started >= 0.5  # watched until the lease was STALE (1 s) old
    stale.write(tmp_path / LEASE)
    with renewing(stale, tmp_path / LEASE), pytest.raises(ConfigError, match="in use by another live job"):
        JobLease(str(tmp_path), None).acquire()


def test_a_lease_last_written_stale_ago_is_taken_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its modification time says it: nothing to watch."""
    holder_of(tmp_path, 1, "another-host")
    aged(tmp_path / LEASE, lease.STALE + 1)
    monkeypatch.setattr(lease.time, "sleep", no_sleep)
    taken_by(tmp_path)


def test_a_free_job_dir_is_taken_without_waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One atomic create: no sleep to see whether another chief wrote last."""
    monkeypatch.setattr(lease.time, "sleep", no_sleep)
    JobLease(str(tmp_path), None).acquire().release()
    assert not (tmp_path / LEASE).exists()


DRIVER = """
import sys, time
from entrypoint.errors import ConfigError
from entrypoint.lifecycle.jobdir import lease
lease.RENEW, lease.STALE, lease._POLL = 0.2, 1.0, 0.05
print("ready", flush=True)
sys.stdin.readline()
try:
    held = lease.JobLease(sys.argv[1], None).acquire()
except ConfigError as exc:
    print("refused:", exc, flush=True)
    sys.exit(2)
print("holding", flush=True)
time.sleep(float(sys.argv[2]))
held.release()
"""


def driver(job_dir: Path, hold: float, *prefix: str) -> subprocess.Popen[str]:
    """A process that takes the lease when told (a line on its stdin) and holds it ``hold`` seconds."""
    root = Path(__file__).resolve().parents[2]
    return subprocess.Popen([*prefix, sys.executable, "-c", DRIVER, str(job_dir), str(hold)], cwd=root, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(root)})


def test_two_chiefs_starting_at_once_one_wins(tmp_path: Path) -> None:
    """Four processes take a free job dir at the same moment: exactly one holds it, the others are refused."""
    procs = [driver(tmp_path, 30) for _ in range(4)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        said = [proc.stdout.readline() for proc in procs if proc.stdout is not None]
        assert sorted(line.split(":")[0].strip() for line in said) == ["holding", "refused", "refused", "refused"], said
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


UNSHARE = shutil.which("unshare")


def can_unshare() -> bool:
    if UNSHARE is None:
        return False
    return subprocess.run([UNSHARE, "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not can_unshare(), reason="needs unshare --pid (root, util-linux)")
def test_a_holder_in_another_pid_namespace_of_this_host_is_not_judged_by_its_pid(tmp_path: Path) -> None:
    """Two containers on one host (same host name, each its own pid namespace): the holder's pid means nothing in
    the other's namespace, so the second one watches the lease, sees it renewed, and is refused."""
    with JobLease(str(tmp_path), None) as held:
        second = driver(tmp_path, 0, UNSHARE or "unshare", "--pid", "--fork", "--mount-proc")
        out, _ = second.communicate("go\n", timeout=120)
        assert second.returncode == 2, out
        assert f"pid {held.me.pid} on host {held.me.host}" in out, out
        assert Holder.read(tmp_path / LEASE).token == held.me.token  # type: ignore[union-attr]


def test_a_job_whose_lease_was_taken_over_is_told_and_fenced(tmp_path: Path) -> None:
    """Another job takes the lease (as a takeover after STALE would): the holder's next renewal finds it, calls
    ``on_lost`` once, ``check`` raises from then on, and the release leaves the new holder's lease in place."""
    lost: list[Holder] = []
    told = threading.Event()
    held = JobLease(str(tmp_path), None, on_lost=lambda holder: (lost.append(holder), told.set())).acquire()
    held.check()
    other = holder_of(tmp_path, 1, "another-host")
    assert told.wait(60)
    assert lost == [other]
    with pytest.raises(ConfigError, match=rf"^--job-dir: {tmp_path} was taken over by another job \(pid 1 on host "
                                          r"another-host, since .*\) while this job ran"):
        held.check()
    held.release()
    assert Holder.read(tmp_path / LEASE) == other


def test_the_fence_reads_the_lease_itself(tmp_path: Path) -> None:
    """Between two renewals too: ``check`` reads the lease."""
    with JobLease(str(tmp_path), None) as held:
        lease.RENEW = 60.0  # type: ignore[misc]  # (the fixture restores it) no renewal in this test
        held.check()
        holder_of(tmp_path, 1, "another-host")
        with pytest.raises(ConfigError, match="was taken over"):
            held.check()


def test_a_lease_on_a_bucket(emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on gs:// (the GCS emulator): held and renewed, refused to another job of another host, released;
    taken over by another job, the holder is told."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.host)
    monkeypatch.setattr(storage, "_filesystems", {})
    job_dir = f"gs://{BUCKET}/lease/job"
    path = storage.path(job_dir) / LEASE
    with JobLease(job_dir, "local:127.0.0.1:1:-") as held:
        assert Holder.read(path) == held.me
        with pytest.raises(ConfigError, match="in use by another live job"):
            JobLease(job_dir, "local:127.0.0.1:2:-", host="another-host").acquire()
        assert Holder.read(path).renewals > 0  # type: ignore[union-attr]
    assert not path.exists()
    told = threading.Event()
    held = JobLease(job_dir, None, on_lost=lambda _holder: told.set()).acquire()
    other = replace(held.me, token="o" * 32, host="another-host")
    other.write(path)
    assert told.wait(60)
    held.release()
    assert Holder.read(path) == other


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
    taken_by(tmp_path)
    zombie.wait()


def wait_for(condition: Any, what: str, timeout: float = 60) -> None:
    """Until ``condition()`` holds (renewals come every 0.2 s here: an event, waited for on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.parametrize("content", [b"", b'{"token": "t", "pid": ', b"\x00" * 40], ids=["emptied", "cut", "zeroed"])
def test_an_emptied_or_damaged_lease_is_written_again_not_taken_over(tmp_path: Path, content: bytes,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """No job's holder is in it, so no job took the dir over: the holder writes its lease again at its next renewal
    (a warning), is never told it was displaced, and its fence stays open."""
    lost: list[Holder] = []
    with JobLease(str(tmp_path), "j", on_lost=lost.append) as held:
        (tmp_path / LEASE).write_bytes(content)
        wait_for(lambda: Holder.read(tmp_path / LEASE) is not None, "the lease written again")
        assert Holder.read(tmp_path / LEASE).token == held.me.token  # type: ignore[union-attr]
        held.check()
        time.sleep(0.5)  # renewals go on as before (nothing to wait for: the absence of a takeover)
        assert lost == [] and held.lost is None
        held.check()
    assert "emptied or damaged" in caplog.text and "taken over" not in caplog.text and "pid 0" not in caplog.text
    assert not (tmp_path / LEASE).exists()  # released as usual


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """``directory`` bind-mounted read-only over itself for the block (skipped where this machine cannot mount)."""
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", "-o", "ro", str(directory), str(directory)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount read-only here")
    try:
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=False)


def test_a_lease_whose_renewals_fail_warns_and_a_second_job_is_told_the_dir_is_in_use(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The job dir becomes read-only under a running job: its renewals fail, which it says once, and trains on. A
    second job on this host is refused as in use (exit 2), not failed for the read-only dir (73) that is the first
    job's doing; when the dir is writable again, renewals go on and say so."""
    caplog.set_level(logging.INFO, logger="entrypoint")
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    with JobLease(str(job_dir), None) as held:
        with read_only(job_dir):
            wait_for(lambda: "could not be renewed" in caplog.text, "the warning")
            assert caplog.text.count("could not be renewed") == 1 and held.lost is None
            second = subprocess.run([sys.executable, "-m", "entrypoint", "run", "--framework", "pytorch", "--module",
                                     "tests.pytorch.faults", "--job-dir", str(job_dir)], env=subprocess_env(),
                                    cwd=ROOT, capture_output=True, text=True, timeout=120)
        wait_for(lambda: "renewed again" in caplog.text, "renewals back")
        held.check()
    assert second.returncode == 2, second.stderr[-2000:]
    last = second.stderr.strip().splitlines()[-1]
    assert f"--job-dir: {job_dir} is in use by another live job (pid {os.getpid()} on host " in last, last
