"""``supervisor.py``'s rules with real tiny children (``python -c``, no framework, each test a second or two):
the first failure stops the rest (SIGTERM, then SIGKILL after the grace period), the policy restarts a
retryable exit, a chief that finished ends the job, and a stop signal to the supervisor reaches every child."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from entrypoint.lifecycle.supervision.restart_policy import RestartPolicy
from entrypoint.lifecycle.supervision.supervisor import Replica, Supervisor, run_replicas
from tests.conftest import subprocess_env

GRACE = 0.5


def stubborn(ready: Path) -> str:
    """A child that reports SIGTERM and keeps sleeping (a slow checkpoint): only SIGKILL ends it."""
    return ("import signal, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: print('got SIGTERM', flush=True))\n"
            f"open({str(ready)!r}, 'w').close()\n"
            "time.sleep(60)\n")


def polite(ready: Path) -> str:
    """A child that sleeps; SIGTERM ends it (Python's default action)."""
    return f"import time\nprint('up', flush=True)\nopen({str(ready)!r}, 'w').close()\ntime.sleep(60)\n"


def exits(code: int, after: Path | None = None) -> str:
    """A child that exits ``code`` (once ``after`` exists: the other child is ready for what follows)."""
    wait = f"while not os.path.exists({str(after)!r}): time.sleep(0.01)\n" if after else ""
    return f"import os, sys, time\n{wait}sys.exit({code})\n"


def replica(index: int, body: str, pool: str = "workerpool0") -> Replica:
    return Replica(pool, index, subprocess_env(), [sys.executable, "-c", body])


def when_ready(paths: list[Path], signum: int) -> threading.Thread:
    """Send ``signum`` to this process once every child is ready."""
    def send() -> None:
        end = time.monotonic() + 10
        while not all(p.exists() for p in paths) and time.monotonic() < end:
            time.sleep(0.01)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("code", [3, 143, 197])
def test_the_first_failure_stops_the_rest_and_is_the_jobs_exit(code: int, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    ready = tmp_path / "ready"
    failing, sleeper = replica(0, exits(code, ready)), replica(1, stubborn(ready))
    started = time.monotonic()
    outcome = run_replicas([failing, sleeper], grace=GRACE)
    took = time.monotonic() - started
    assert (outcome.code, outcome.first) == (code, failing)
    assert sleeper.exit_code == 137  # SIGTERM ignored, so SIGKILL after the grace period
    assert GRACE < took < 30  # the stubborn child sleeps 60 s: it was killed, not waited for (a loaded machine starts
    # the replicas slowly, so no tighter bound)
    out = capsys.readouterr().out
    assert "[workerpool0-1] got SIGTERM" in out
    assert f"[local] workerpool0-0 exited with {code} (" in out and "stopping the others" in out


def test_a_child_that_stops_on_sigterm_is_not_killed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ready = tmp_path / "ready"
    failing, sleeper = replica(0, exits(2, ready)), replica(1, polite(ready))
    started = time.monotonic()
    outcome = run_replicas([failing, sleeper], grace=60)
    assert outcome.code == 2 and sleeper.exit_code == 143
    assert time.monotonic() - started < 30  # no wait for the 60 s grace period (nor the child's 60 s sleep)
    assert "[workerpool0-1] up" in capsys.readouterr().out


def test_every_child_succeeding_is_success() -> None:
    outcome = run_replicas([replica(i, exits(0)) for i in range(3)], grace=GRACE)
    assert (outcome.code, outcome.first, outcome.why) == (0, None, "")


def test_never_ends_at_a_retryable_failure_with_the_reason(tmp_path: Path) -> None:
    outcome = run_replicas([replica(0, exits(143)), replica(1, polite(tmp_path / "ready"))], grace=GRACE)
    assert outcome.code == 143 and outcome.why == "--restart-policy never"


def test_a_retryable_exit_is_restarted_in_place_under_vertex(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The first attempt exits 143; the restart (attempt 1, same replica) succeeds."""
    flag = tmp_path / "ran-once"
    body = (f"import os, sys\nflag = {str(flag)!r}\n"
            "if os.path.exists(flag): sys.exit(0)\nopen(flag, 'w').close()\nsys.exit(143)\n")
    failed: list[tuple[str, int]] = []
    flaky = replica(0, body, pool="workerpool1")
    outcome = Supervisor([flaky], grace=GRACE, policy=RestartPolicy("vertex"),
                         on_failure=lambda r, code: failed.append((r.name, code))).run()
    assert outcome.code == 0 and flaky.attempt == 1 and flaky.prefix == "workerpool1-0#1"
    assert outcome.counts.per_replica == {"workerpool1-0": 1}
    assert failed == [("workerpool1-0", 143)]
    assert "workerpool1-0 exited 143 (retryable): restart 1 of 5" in capsys.readouterr().out


def test_a_permanent_exit_is_not_restarted_under_vertex(tmp_path: Path) -> None:
    outcome = run_replicas([replica(0, exits(1)), replica(1, polite(tmp_path / "ready"))], grace=GRACE,
                           policy=RestartPolicy("vertex"))
    assert outcome.code == 1 and "permanent" in outcome.why and outcome.counts.total == 0


def test_a_finished_chief_stops_the_others_after_the_grace_period(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    ready = tmp_path / "ready"
    chief, worker = replica(0, exits(0, ready)), replica(1, polite(ready))
    outcome = run_replicas([chief, worker], grace=GRACE, policy=RestartPolicy("vertex"))
    assert outcome.code == 0 and worker.exit_code == 143
    assert "the chief finished the job 0.5 s ago: stopping workerpool0-1" in capsys.readouterr().out


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_to_the_supervisor_reaches_every_child(signum: int, code: int, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    ready = [tmp_path / "stubborn", tmp_path / "polite"]
    children = [replica(0, stubborn(ready[0])), replica(1, polite(ready[1]))]
    sender = when_ready(ready, signum)
    outcome = run_replicas(children, grace=GRACE)
    sender.join()
    assert outcome.code == code and outcome.first is None
    # SIGINT: KeyboardInterrupt in both (the stubborn child traps only SIGTERM); SIGTERM: it needs the SIGKILL.
    assert [c.exit_code for c in children] == ([137, 143] if signum == signal.SIGTERM else [130, 130])
    assert f"received {signal.Signals(signum).name}: forwarding it to every process" in capsys.readouterr().out
    assert {s: signal.getsignal(s) for s in previous} == previous


def test_the_replicas_lines_hide_the_secrets_it_is_given(capfd: pytest.CaptureFixture[str]) -> None:
    """The Horovod launcher passes its node's secrets: a worker's own print() of one is hidden, as under local."""
    printer = replica(0, "print('token is s3cr3t-value and repr ' + repr('s3cr3t-value'), flush=True)")
    assert run_replicas([printer], label="horovod", grace=GRACE, secrets=frozenset({"s3cr3t-value"})).code == 0
    out = capfd.readouterr().out
    assert "token is" in out and "s3cr3t-value" not in out, out
