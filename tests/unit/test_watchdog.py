"""The hang watchdog's two clocks: the start-up's (``--startup-timeout``, through the first training step) and the
steps' (``--hang-timeout``, from the end of the first step on); which fires, with what class, code and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from entrypoint import errors, failures
from entrypoint.lifecycle.watch import peers, watchdog
from entrypoint.lifecycle.watch.watchdog import HangWatchdog
from entrypoint.planning.runargs import parse_options


def clock(dog: HangWatchdog) -> float:
    """The moment the watchdog's clocks started (both start at ``start``)."""
    return dog._began


def test_a_slow_start_is_not_a_hang_the_start_up_clock_runs_through_every_phase() -> None:
    dog = HangWatchdog(10, failures.FailureContext(), startup_timeout=100)
    began = clock(dog)
    for phase in ("building the datasets (build_datasets)", "building the model (build_model)",
                  "resuming from the newest checkpoint", "wrapping the model for data parallelism"):
        dog.beat(0, phase)  # the loop's phases: none of them restarts the start-up's clock
        assert dog.starting_up
    assert dog.expired(began + 50) is None  # five times --hang-timeout: still starting up, not hung
    assert dog.expired(began + 101) == (100, "--startup-timeout")


def test_the_first_training_step_belongs_to_the_start_up_and_the_step_clock_starts_after_it() -> None:
    dog = HangWatchdog(10, failures.FailureContext(), startup_timeout=100)
    began = clock(dog)
    dog.phase = "in the first training step (first imports, compilation)"
    assert dog.expired(began + 60) is None  # a slow first step (import torch._dynamo on a loaded machine)
    dog.trained(1, "waiting for the next batch")
    assert not dog.starting_up
    ended = dog._last
    assert dog.expired(ended + 9) is None and dog.expired(ended + 11) == (10, "--hang-timeout")
    assert dog.expired(began + 1000) is not None and dog.expired(began + 1000)[1] == "--hang-timeout"
    dog.beat(2, "waiting for the next batch")  # after the start-up, a beat restarts the step clock
    assert dog._last >= ended and dog.ctx.step == 2


def test_either_clock_can_be_off() -> None:
    no_startup = HangWatchdog(10, failures.FailureContext(), startup_timeout=0)
    assert no_startup.expired(clock(no_startup) + 10_000) is None  # 0: a start-up may take as long as it takes
    no_startup.end_startup()  # nothing left to train (a rerun at the final checkpoint): the step clock holds
    assert no_startup.expired(no_startup._last + 11) == (10, "--hang-timeout")
    no_hang = HangWatchdog(0, failures.FailureContext(), startup_timeout=5)
    assert no_hang.expired(clock(no_hang) + 6) == (5, "--startup-timeout")
    no_hang.trained(1)
    assert no_hang.expired(no_hang._last + 10_000) is None


def test_the_startup_timeout_flag_defaults_to_a_generous_limit_and_is_planned() -> None:
    options = parse_options("run", ["--module", "m"])
    assert options.startup_timeout == 1800 and options.hang_timeout == 1800
    assert parse_options("run", ["--startup-timeout", "0"]).startup_timeout == 0  # 0: off
    with pytest.raises(errors.ConfigError, match=r"--startup-timeout: .*finite number"):
        parse_options("run", ["--startup-timeout", "inf"])
    assert type(options).from_dict(options.to_dict()) == options


def test_the_startup_timeout_class_is_permanent_with_a_code_of_its_own() -> None:
    assert (errors.STARTUP_TIMEOUT.name, errors.STARTUP_TIMEOUT.exit_code) == ("startup_timeout", 124)
    assert not errors.is_retryable(errors.STARTUP_TIMEOUT.exit_code)
    assert errors.STARTUP_TIMEOUT.name not in errors.CONSEQUENCES  # a root cause, never a peer's consequence


class Exited(Exception):
    pass


def fire(dog: HangWatchdog, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run the expired clock's failure; the exit code and the last line (the process is not ended)."""
    def exit_(code: int) -> None:
        raise Exited(code)

    monkeypatch.setattr(watchdog.os, "_exit", exit_)
    monkeypatch.setattr(watchdog.faulthandler, "dump_traceback", lambda **_: None)
    expired = dog.expired(clock(dog) + 10_000)
    assert expired is not None
    with pytest.raises(Exited) as ended:
        dog._fire(*expired)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("entrypoint: error:")]
    return int(ended.value.args[0]), lines[-1]


def records(job_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((job_dir / "failures").glob("*.json"))]


def test_an_expired_start_up_names_the_phase_and_the_flag_and_is_permanent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ctx = failures.FailureContext(replica="workerpool0-0", rank=0, job_dir=str(tmp_path))
    dog = HangWatchdog(10, ctx, startup_timeout=30)
    dog.beat(0, "building the model (build_model)")
    code, line = fire(dog, monkeypatch, capsys)
    assert code == 124
    assert line.startswith("entrypoint: error: startup_timeout on workerpool0-0, rank 0"), line
    assert "still building the model (build_model) after 30 s (--startup-timeout); raise --startup-timeout if this " \
        "start is expected to be slow" in line and line.endswith("(exit 124, permanent)"), line
    assert [r["class"] for r in records(tmp_path)] == ["startup_timeout"]


class Board:
    """A peer board whose one other member stopped its heartbeat."""

    def __init__(self) -> None:
        self.step = 0

    def silent(self) -> list[peers.Silent]:
        return [peers.Silent(peers.Member(1, "workerpool1-0", "h1"), 0, "no heartbeat for 9 s")]


def test_a_start_up_stuck_waiting_for_a_silent_peer_blames_the_peer_retryably(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ctx = failures.FailureContext(replica="workerpool0-0", rank=0, job_dir=str(tmp_path))
    dog = HangWatchdog(10, ctx, startup_timeout=30)
    dog.board = Board()  # type: ignore[assignment]
    dog.beat(0, "in the first training step (first imports, compilation)")
    code, line = fire(dog, monkeypatch, capsys)
    assert code == 129  # the peer froze: a restart can help
    assert line.startswith("entrypoint: error: hang on workerpool1-0"), line
    assert "stopped responding" in line and "--startup-timeout" in line, line
    assert sorted(r["class"] for r in records(tmp_path)) == ["hang", "hang"]


def test_an_expired_step_clock_is_still_a_retryable_hang(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ctx = failures.FailureContext(replica="workerpool0-0", rank=0, job_dir=str(tmp_path))
    dog = HangWatchdog(10, ctx, startup_timeout=30)
    dog.trained(4, "in a training step")
    dog._began = dog._last = dog._last - 100  # long after the start-up ended
    code, line = fire(dog, monkeypatch, capsys)
    assert code == 129 and line.startswith("entrypoint: error: hang on workerpool0-0"), line
    assert "no training step completed for 10 s (--hang-timeout)" in line and "after step 4" in line, line


def test_a_phase_with_an_allowance_has_that_much_more_than_the_hang_timeout_until_the_next_beat(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A framework's own wait with a known bound (TensorFlow's validation pipeline teardown: tf.data's autotuning
    wakes every 60 s at most) is not a hang within that bound; past it, it is, and the line says both limits."""
    ctx = failures.FailureContext(replica="workerpool0-0", rank=0, job_dir=str(tmp_path))
    dog = HangWatchdog(10, ctx, startup_timeout=30)
    dog.trained(4, "in a training step")
    dog.beat(4, "between steps (validation done)", (60.0, "the pipeline's teardown"))
    beat = dog._last
    assert dog.expired(beat + 69) is None and dog.expired(beat + 71) == (10, "--hang-timeout")
    dog.beat(4, "checkpointing at the end of an epoch")  # the next beat ends the allowance
    assert dog.expired(dog._last + 11) == (10, "--hang-timeout")
    dog.beat(4, "between steps (validation done)", (60.0, "the pipeline's teardown"))
    dog._began = dog._last = dog._last - 100
    code, line = fire(dog, monkeypatch, capsys)
    assert code == 129, line
    assert "no training step completed for 10 s (--hang-timeout) and 60 s more (the pipeline's teardown)" in line, line


def test_a_hang_in_the_same_phase_at_every_attempt_says_once_which_limit_to_raise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    said = []
    for _attempt in range(3):
        ctx = failures.FailureContext(replica="workerpool0-0", rank=0, job_dir=str(tmp_path))
        dog = HangWatchdog(10, ctx, startup_timeout=30)
        dog.trained(44, "evaluating (batch 3 of 12)")
        dog._began = dog._last = dog._last - 100
        said.append(fire(dog, monkeypatch, capsys)[1])
        assert records(tmp_path)[-1]["phase"] == "evaluating (batch 3 of 12)"
    assert "raise" not in said[0], said[0]  # a first hang is a hang: a restart may help
    for attempts, line in ((2, said[1]), (3, said[2])):
        assert line.count("raise --hang-timeout") == 1, line
        assert f"the same at each of the {attempts} attempts so far: raise --hang-timeout (now 10 s) if evaluating " \
            "(batch 3 of 12) takes longer" in line, line


def test_an_attempt_that_stalled_elsewhere_breaks_the_run_of_alike_failures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for phase in ("building the model (build_model)", "waiting for the next batch"):
        ctx = failures.FailureContext(replica="workerpool0-0", rank=0, job_dir=str(tmp_path))
        dog = HangWatchdog(10, ctx, startup_timeout=30)
        dog.trained(8, phase)
        dog._began = dog._last = dog._last - 100
        line = fire(dog, monkeypatch, capsys)[1]
    assert "raise" not in line and "attempts" not in line, line  # the two attempts hung in different phases


def test_a_live_read_is_a_beat_after_the_start_up_not_during_it() -> None:
    dog = HangWatchdog(10, failures.FailureContext(), startup_timeout=100)
    read = [0]
    dog.progress = lambda: read[0]
    began = clock(dog)
    read[0] = 5
    dog._live(began + 50)  # the start-up has its own budget: reading does not extend it
    assert dog.expired(began + 101) == (100, "--startup-timeout")
    dog.trained(1, "waiting for the next batch")
    ended = dog._last
    dog._live(ended + 9)  # samples read since the last look: the wait for a batch is alive
    assert dog.expired(ended + 15) is None and dog.expired(ended + 20) == (10, "--hang-timeout")
    dog._live(ended + 30)  # nothing read since: the clock was not moved
    assert dog.expired(ended + 30) == (10, "--hang-timeout")


def test_the_loaders_reads_are_counted_in_shared_memory() -> None:
    counter = watchdog.reads()
    assert watchdog.reads() is counter  # one per process, made once
    before = counter.value
    counter.value += 3
    assert watchdog.reads().value == before + 3


class Request:
    """A stop signal that arrived ``since`` seconds ago (no real signal)."""

    def __init__(self, since: float) -> None:
        self.signum, self.requested, self._since = 15, True, since

    def since(self) -> float:
        return self._since

    def nudge(self) -> None:
        pass


@pytest.mark.parametrize(("kept", "cls"), [(True, "preempted"), (False, "preempted_uncommitted")])
def test_a_stop_that_outlives_the_grace_period_ends_the_process_saying_what_is_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], kept: bool,
        cls: str) -> None:
    ctx = failures.FailureContext(replica="workerpool0-0", rank=0, job_dir=str(tmp_path))
    dog = HangWatchdog(10, ctx, startup_timeout=30)
    words = "the checkpoint of step 12 is committed" if kept else "step 12 was not committed: ..., losing 4 steps"
    dog.stop_deadline(Request(9.0), 10.0, lambda: (words, kept))  # type: ignore[arg-type]
    dog.phase = "saving before stopping"
    assert dog._deadline is not None and dog._deadline[1] == 8.0  # --grace-period less its record's margin
    monkeypatch.setattr(watchdog.os, "_exit", lambda code: (_ for _ in ()).throw(Exited(code)))
    monkeypatch.setattr(watchdog.faulthandler, "dump_traceback", lambda **_: None)
    with pytest.raises(Exited) as ended:
        dog._fire_stop()
    assert ended.value.args[0] == 143
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("entrypoint: error:")][-1]
    assert line.startswith(f"entrypoint: error: {cls} on workerpool0-0, rank 0"), line
    assert f"stopped by SIGTERM: its grace period ran out while saving before stopping; {words}" in line, line
    assert [r["class"] for r in records(tmp_path)] == [cls]


def test_the_margin_a_stopping_process_keeps_for_its_record() -> None:
    assert watchdog.record_margin(25) == 2.0 and watchdog.record_margin(10) == 2.0
    assert watchdog.record_margin(4) == pytest.approx(0.8)
