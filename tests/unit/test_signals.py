"""``signals.py``: exit statuses of signals, the training process's StopRequest, the supervisor's Forwarder and
terminate, ``stop_at_once`` and ``deadline``. Real signals to this process (main thread) or to tiny children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from entrypoint.errors import Interrupted, StopRequested, exit_code_of, signal_exit_code
from entrypoint.lifecycle import signals
from tests.conftest import ROOT, subprocess_env

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)


@pytest.fixture(autouse=True)
def restore_handlers() -> Iterator[None]:
    """Whatever a test installs, pytest gets its own handlers (and no pending alarm) back."""
    saved = {sig: signal.getsignal(sig) for sig in HANDLED}
    yield
    signal.alarm(0)
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def wait_for(condition: Callable[[], bool], timeout: float = 1.0) -> bool:
    """Python runs a handler between bytecodes of the main thread: give it a moment."""
    end = time.monotonic() + timeout
    while not condition() and time.monotonic() < end:
        time.sleep(0.005)
    return condition()


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGKILL, 137), (signal.SIGINT, 130),
                                              (signal.SIGALRM, 142), (signal.SIGHUP, 129)])
def test_a_signal_exits_128_plus_its_number(signum: int, code: int) -> None:
    assert signal_exit_code(signum) == code
    assert exit_code_of(-signum) == code  # Popen.returncode of a child the signal killed


@pytest.mark.parametrize("returncode", [0, 1, 2, 73, 129, 143, 197, 255])
def test_a_childs_own_exit_status_is_kept(returncode: int) -> None:
    assert exit_code_of(returncode) == returncode


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_request_turns_a_stop_signal_into_a_flag(signum: int, capsys: pytest.CaptureFixture[str]) -> None:
    request = signals.StopRequest().install()
    assert not request.requested and request.received_at is None
    os.kill(os.getpid(), signum)
    assert wait_for(lambda: request.requested)
    assert request.signum == signum and request.received_at is not None
    assert f"received {signal.Signals(signum).name}: stopping at the next step boundary" in capsys.readouterr().err
    request.uninstall()


def test_stop_request_keeps_the_first_signal_and_gives_the_handlers_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    request = signals.StopRequest().install().install()  # idempotent: the previous handler is not lost
    os.kill(os.getpid(), signal.SIGTERM)
    assert wait_for(lambda: request.requested)
    first = request.received_at
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.02)
    assert request.signum == signal.SIGTERM and request.received_at == first
    request.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_forwarder_remembers_signals_for_its_wait_loop() -> None:
    before = {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS}
    with signals.Forwarder() as forwarder:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_for(lambda: len(forwarder.received) == 2)
        assert sorted(forwarder.received) == sorted([signal.SIGINT, signal.SIGTERM])
    assert {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS} == before


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_at_once_raises_where_the_main_thread_stands(signum: int) -> None:
    with pytest.raises(StopRequested) as info, signals.stop_at_once("serving"):
        os.kill(os.getpid(), signum)
        time.sleep(1)  # interrupted: the handler raises
    assert info.value.exit_code == signal_exit_code(signum)
    assert str(info.value) == f"stopped by {signal.Signals(signum).name} while serving"


def test_stop_at_once_without_a_signal_gives_the_handlers_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with signals.stop_at_once("serving"):
        pass
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_deadline_met_cancels_its_alarm_and_restores_the_handler() -> None:
    def mine(_s: int, _f: object) -> None:
        raise AssertionError("the alarm outlived its block")

    signal.signal(signal.SIGALRM, mine)
    with signals.deadline(0.5):
        assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    assert signal.alarm(0) == 0  # nothing pending
    assert signal.getsignal(signal.SIGALRM) is mine


def test_a_deadline_missed_ends_the_process_with_142() -> None:
    """SIGALRM's default action: no handler to swallow; the alarm has a 1 s granularity (at least 1 s)."""
    code = "import time; from entrypoint.lifecycle.signals import deadline\nwith deadline(0.2): time.sleep(30)"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), timeout=10)
    assert exit_code_of(proc.returncode) == 142
    assert time.monotonic() - started < 20  # the alarm, not the 30 s sleep, ended it


def sleeper(trap: bool) -> subprocess.Popen[bytes]:
    """A child in its own session sleeping 60 s; ``trap``: it ignores SIGTERM (a slow checkpoint, say)."""
    body = "import signal, sys, time\n"
    if trap:
        body += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    body += "print('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", body], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def test_terminate_forwards_then_kills_what_outlives_the_grace_period() -> None:
    polite, stubborn = sleeper(trap=False), sleeper(trap=True)
    started = time.monotonic()
    signals.terminate([polite, stubborn], signal.SIGTERM, 0.3)
    took = time.monotonic() - started
    assert (exit_code_of(polite.returncode), exit_code_of(stubborn.returncode)) == (143, 137)
    assert 0.25 < took < 30  # the stubborn child sleeps 60 s: SIGKILL ended it after the grace period
    for proc in (polite, stubborn):
        assert proc.stdout is not None
        proc.stdout.close()


def test_terminate_ends_what_a_child_leaves_in_its_group() -> None:
    """A child that exits on SIGTERM, and its own child that ignores it in the same group: the grandchild gets the
    rest of the grace period, then SIGKILL; nothing of the group is left."""
    body = ("import signal, subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(\"child\", flush=True); time.sleep(60)'])\n"
            "time.sleep(0.5)\nprint('ready', child.pid, flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", body], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    while not (line := proc.stdout.readline()).startswith(b"ready"):
        assert line, "the child did not start"
    grandchild = int(line.split()[1])
    started = time.monotonic()
    signals.terminate([proc], signal.SIGTERM, 1.0)
    assert exit_code_of(proc.returncode) == 143
    assert 0.9 < time.monotonic() - started < 30  # the grandchild sleeps 60 s: killed after the grace period
    assert signals._in_group(proc.pid) == [], f"grandchild {grandchild} outlived terminate"
    proc.stdout.close()


def test_a_thread_hears_a_stop_signal_arrive_and_another_wakeup_fd_is_left_alone() -> None:
    """``watch_arrivals``: the C handler's wakeup fd hands each stop signal to a thread of its own (which hears it
    even while the main thread is in native code: tests/tensorflow/test_stops.py); another owner's fd is kept."""
    heard: list[tuple[int, str]] = []
    signal.signal(signal.SIGTERM, lambda *_: None)  # Python's handler: the C one writes the wakeup fd first
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        signal.set_wakeup_fd(write)
        assert not signals.watch_arrivals(lambda signum: heard.append((signum, "")))
        assert signal.set_wakeup_fd(-1) == write  # the other owner's, untouched
        assert signals.watch_arrivals(lambda signum: heard.append((signum, threading.current_thread().name)))
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_for(lambda: bool(heard), 5.0)
        assert heard == [(signal.SIGTERM, "signal-arrivals")]
    finally:
        signal.set_wakeup_fd(-1)
        os.close(read)
        os.close(write)
def test_a_stop_in_an_interruptible_region_ends_it_at_once_and_only_once(capsys: pytest.CaptureFixture[str]) -> None:
    request = signals.StopRequest().install()
    try:
        with pytest.raises(Interrupted) as stopped, request.interruptible("building the model"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # interrupted: the handler raises where the main thread stands
        assert stopped.value.signum == signal.SIGTERM and stopped.value.what == "building the model"
        assert str(stopped.value) == "stopped by SIGTERM while building the model"
        assert "received SIGTERM: stopping (building the model)" in capsys.readouterr().err
        with request.interruptible("exporting"):  # the stop's own commit is never interrupted again
            os.kill(os.getpid(), signal.SIGTERM)
            assert wait_for(lambda: True, 0.1)
        assert request.region is None  # the region before it is back
    finally:
        request.uninstall()


def test_a_stop_that_came_before_a_region_ends_it_as_it_starts() -> None:
    request = signals.StopRequest().install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_for(lambda: request.requested)  # outside a region: a flag, nothing raised
        with pytest.raises(Interrupted):
            request.enter("the export")
    finally:
        request.uninstall()


def test_a_region_with_patience_leaves_a_stop_to_the_vote_until_its_patience_ran_out() -> None:
    request = signals.StopRequest().install()
    try:
        request.enter("waiting for the next batch", patience=0.3)
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_for(lambda: request.requested)  # a wait that ends within its patience is not interrupted
        request.nudge()  # too early: nothing sent
        time.sleep(0.05)
        request.enter(None)  # the batch came: the step vote takes the stop
        request.nudge()
        request.enter("waiting for the next batch", patience=0.3)  # a slow one this time
        with pytest.raises(Interrupted) as stopped:
            time.sleep(0.35)
            request.nudge()  # the watchdog's thread: the patience ran out, the signal is sent again
            time.sleep(5)
        assert stopped.value.what == "waiting for the next batch"
    finally:
        request.enter(None)
        request.uninstall()


def test_an_interruption_is_a_stop_to_the_failure_funnel_but_no_exception_handler_holds_it() -> None:
    from entrypoint import failures

    stop = Interrupted(signal.SIGTERM, "restoring")
    assert not isinstance(stop, Exception)  # ``except Exception`` (a hook's, a library's) lets it through
    failure = failures.classify(stop)
    assert (failure.cls.name, failure.exit_code, failure.message) == ("preempted", 143,
                                                                     "stopped by SIGTERM while restoring")


def test_a_subreaper_reaps_the_descendants_it_adopted_that_ended_and_names_only_those_still_running() -> None:
    """``local`` is the subreaper of its replicas' descendants: a rank of a SIGKILLed node (in a session of its own)
    dies with its launcher, and its zombie is reaped while the job runs (``reap_adopted``), not named at the end as
    a process that outlived the job; a descendant still running at the end is (``end_adopted``)."""
    body = """
import json, os, subprocess, sys, time
from entrypoint.lifecycle import signals
signals.adopt_orphans()
def child(code):
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
def orphan(sleep):  # a child that starts a grandchild in a session of its own and ends at once
    launcher = child(f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; "
                     f"time.sleep({sleep})'], start_new_session=True); print(p.pid)")
    pid = int(launcher.stdout.readline())
    launcher.wait()
    return launcher.pid, pid
gone, ended = orphan(0.2)
_, running = orphan(60)
ours = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])  # started by us, in our own group
time.sleep(2)
state = {pid: s for pid, s, ppid, _ in signals._processes() if ppid == os.getpid()}
reaped = signals.reap_adopted([gone])
assert ours.pid not in reaped and ours.wait() == 3, (ours.pid, reaped)  # its own wait reads its status
after = {pid for pid, s, ppid, _ in signals._processes() if ppid == os.getpid()}
print(json.dumps({"ended": ended, "running": running, "state": state.get(ended), "reaped": reaped,
                  "after": sorted(after), "at_end": signals.end_adopted([])}))
"""
    proc = subprocess.run([sys.executable, "-c", body], cwd=ROOT, env=subprocess_env(), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["state"] == "Z"  # adopted, ended, not reaped by anyone until the subreaper does
    assert seen["reaped"] == [seen["ended"]] and seen["after"] == [seen["running"]]
    assert seen["at_end"] == [seen["running"]]
    assert f"pids {seen['running']} outlived the job" in proc.stderr
    assert str(seen["ended"]) not in proc.stderr
