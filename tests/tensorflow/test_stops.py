"""A stop in any phase of a TensorFlow hooks job commits the newest trained step every worker agrees on, within the
grace period, and the exit says what was committed (docs/tensorflow.md#preemption-sigterm).

The stops come at a random moment of a validation pass (the slow phase between two training steps that used to hold
a stop until the platform's SIGKILL), always sent when the job's own output shows the pass began, never after a fixed
sleep from the start; the platform's SIGKILL follows at the grace period when the process is still there (then the
test fails: it must have committed and left before). Each job resumes from what its stop committed and ends with the
same weights, bit for bit, as the same job uninterrupted: the toy data is not shuffled, and a stop in a validation pass
follows the epoch's last step, so the resumed job trains the very batches the uninterrupted one does.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from entrypoint.failures.records import read_records
from entrypoint.lifecycle.startup.ports import free_ports
from entrypoint.outputs.checkpoints import checkpoint_path, committed, read_marker
from tests.conftest import PYTHON, ROOT, subprocess_env
from tests.metadata import FakeMetadata
from tests.references import reference
from tests.runs import Job, wait_gone
from tests.tensorflow.runs import JOB_TIMEOUT, SLOW, Stopped, run_args, run_job, summary, tail

pytestmark = [pytest.mark.tensorflow]
SLOW_EVAL = "tests.tensorflow.slow_eval_hooks"
BEGINS = r"validation pass begins \((\d+)\) in pid (\d+)"
GRACE = 20.0  # the platform's grace in these tests: SIGKILL after it (docs/tensorflow.md gives the figures)
EPOCHS = 3
ONE = 16  # steps per epoch on one worker: 256 examples, batch 16
TWO = 8  # on two workers: global batch 32
# One worker: 128 validation examples in 8 batches of 16, 0.05 s each: a pass of 6.4 s or more, stopped at most 3 s
# after it began (the test reads its line a little later): the stop is taken in the pass, not at its end.
ONE_PAUSE = "0.05"
# Two workers: each reads every example (DATA sharding), 256 of them in 8 global batches: a pass of 10 s or more,
# stopped at most 4 s after it began; 12.8 s with the notice's pause (the platform's kill must fall in it).
TWO_EVAL = ["--", "--eval-repeat", "4", "--eval-pause"]
TWO_PAUSE, NOTICE_PAUSE = "0.04", "0.05"
# The pause changes no metric: a job that is not stopped (the uninterrupted references, a rerun after the last stop)
# validates without it, and its weights and history must still equal the stopped job's (assert_same_as checks it).
# Nor does a restarted attempt's first pass, which validates the restored epoch again: only a later one is stopped.
NO_PAUSE = "0"
RESUMED = ["--resumed-eval-pause", NO_PAUSE]
COMMITTED = re.compile(r"checkpoint committed \(([\d.]+) s after the signal\)")


def nth_pass(nth: int) -> str:
    """The line of a process's ``nth`` validation pass (its pid in group 1)."""
    return rf"validation pass begins \({nth}\) in pid (\d+)"


def stop_in_pass(command: list[str], cwd: Path, nth: int, delay: float, grace: float = GRACE) -> Stopped:
    """Start a one-node job; ``delay`` seconds after its ``nth`` validation pass began, SIGTERM it; SIGKILL its
    group at ``grace`` seconds after that if it is still there (the platform's kill); how it ended."""
    proc = subprocess.Popen(command, cwd=cwd, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    assert proc.stdout is not None
    lines: list[str] = []
    passes = 0
    for line in proc.stdout:
        lines.append(line)
        passes += bool(re.search(BEGINS, line))
        if passes >= nth:
            break
    assert passes >= nth, f"the job ended before validation pass {nth}:\n{''.join(lines[-60:])}"
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    seconds = time.monotonic() - sent
    return Stopped(proc.returncode if proc.returncode >= 0 else 128 - proc.returncode, seconds, 0,
                   "".join(lines) + out)


def weights_differ(a: Path, b: Path) -> list[str]:
    """The variables whose values differ between two checkpoints' weights (read in a fresh TensorFlow process)."""
    code = ("import sys, json, numpy as np, tensorflow as tf\n"
            "a, b = (tf.train.load_checkpoint(p) for p in sys.argv[1:])\n"
            "names = sorted(n for n in a.get_variable_to_shape_map() if not n.startswith('_CHECKPOINTABLE'))\n"
            "assert names == sorted(n for n in b.get_variable_to_shape_map() if not n.startswith('_CHECKPOINTABLE'))\n"
            "print(json.dumps([n for n in names if not np.array_equal(a.get_tensor(n), b.get_tensor(n))]))")
    proc = subprocess.run([PYTHON, "-c", code, str(a / "weights"), str(b / "weights")], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return list(json.loads(proc.stdout.strip().splitlines()[-1]))


def assert_same_as(job_dir: Path, baseline: Path) -> None:
    """The job ended where the uninterrupted one did: the same final step, weights and per-epoch metrics."""
    final, path = committed(job_dir / "checkpoints")[-1]
    step, reference = committed(baseline / "checkpoints")[-1]
    assert final == step
    assert weights_differ(path, reference) == []
    assert summary(job_dir / "model")["history"] == summary(baseline / "model")["history"]


def one_worker(job: Path, pause: str = ONE_PAUSE) -> list[str]:
    return [PYTHON, "-m", "entrypoint", *run_args("--module", SLOW_EVAL, "--job-dir", str(job), "--epochs",
                                                  str(EPOCHS), "--keep-checkpoints", "5", "--", "--eval-pause", pause,
                                                  "--eval-repeat", "2", *RESUMED)]


@pytest.fixture(scope="module")
def uninterrupted_one(tmp_path_factory: pytest.TempPathFactory) -> Path:
    job = tmp_path_factory.mktemp("uninterrupted-one") / "job"
    proc = run_job(one_worker(job, NO_PAUSE), job.parent)
    assert proc.returncode == 0, tail(proc)
    return job


@pytest.mark.slow
def test_one_worker_stopped_in_its_validation_passes_commits_each_epochs_step_and_resumes_bit_exact(
        tmp_path: Path, uninterrupted_one: Path) -> None:
    job, rng = tmp_path / "job", random.Random()
    nth = 1  # the pass to stop in
    for epoch in range(1, EPOCHS):
        delay = rng.uniform(0.2, 3.0)
        stopped = stop_in_pass(one_worker(job), tmp_path, nth, delay)
        assert stopped.code == 143, f"{stopped.seconds:.1f} s after SIGTERM ({delay:.1f} s into the pass):\n" + \
            stopped.output[-4000:]
        step, path = committed(job / "checkpoints")[-1]
        assert step == epoch * ONE, stopped.output[-3000:]  # the newest trained step: the epoch's last
        marker = read_marker(path)
        assert marker["stopped_by"] == "SIGTERM on node-0" and marker["epoch"] == epoch
        record = read_records(str(job), 0)[-1]
        assert record.failure_class == "preempted" and record.exit_code == 143
        assert f"at step {step}" in record.message and f"resumes from {path}" in record.message
        assert marker["validated"] is False  # the pass was abandoned, not finished first
        assert f"validating epoch {epoch} (abandoned after" in record.message
        nth = 2  # the restart validates that epoch again first
        took = COMMITTED.search(record.message)
        assert took is not None, record.message
        print(f"figure: one worker, stopped in the validation pass {delay:.1f} s into it: committed {took.group(1)} s, "
              f"exited {stopped.seconds:.1f} s after SIGTERM")
    proc = run_job(one_worker(job, NO_PAUSE), tmp_path)  # the last epoch's pass: nothing stops it
    assert proc.returncode == 0, tail(proc)
    result = summary(job / "model")
    assert result["final_step"] == EPOCHS * ONE
    assert [r["lost_steps"] for r in result["recoveries"]] == [0] * (EPOCHS - 1)
    assert_same_as(job, uninterrupted_one)


def test_a_stop_while_building_the_model_ends_at_once_saying_nothing_was_trained(tmp_path: Path) -> None:
    job = tmp_path / "job"
    proc = subprocess.Popen([PYTHON, "-m", "entrypoint", *run_args("--module", SLOW, "--job-dir", str(job), "--",
                                                                   "--build-sleep", "60")],
                            cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "build_model: sleeping" in line:
            break
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    out, _ = proc.communicate(timeout=GRACE)
    print(f"figure: one worker, stopped while building the model: exited {time.monotonic() - sent:.1f} s after SIGTERM")
    assert proc.returncode == 143, out[-3000:]
    records = read_records(str(job), 0)
    assert [(r.failure_class, r.exit_code) for r in records] == [("preempted", 143)]  # nothing trained, nothing lost
    expected = ("stopped by SIGTERM while building the model (build_model): nothing trained in this attempt, so "
                "nothing to commit; the restart resumes from the job's newest committed checkpoint")
    assert expected in records[0].message
    last = [line for line in out.splitlines() if line.strip()][-1]
    assert expected in last and "preempted on node-0" in last, last
    assert committed(job / "checkpoints") == []


def test_a_validation_batch_longer_than_the_grace_period_ends_with_it_saying_what_is_not_committed(
        tmp_path: Path) -> None:
    """One validation batch takes 16 s, the grace period 4: the stop cannot be taken at a point in time (the main
    thread is in TensorFlow's native code, which runs no Python handler before it returns), so the replica ends as
    the grace period does, less its margin, before the platform's SIGKILL would, and says what it could not commit."""
    job = tmp_path / "job"
    command = [PYTHON, "-m", "entrypoint", *run_args("--module", SLOW_EVAL, "--job-dir", str(job), "--grace-period",
                                                     "4", "--", "--eval-pause", "1")]
    stopped = stop_in_pass(command, tmp_path, 1, 0.5, grace=10)
    assert stopped.code == 143, stopped.output[-3000:]
    assert 3 <= stopped.seconds < 10  # 4 s less the record's margin (0.8 s)
    print(f"figure: one worker, a validation batch of 16 s: ended {stopped.seconds:.1f} s after SIGTERM "
          "(--grace-period 4)")
    records = read_records(str(job), 0)
    assert [(r.failure_class, r.exit_code) for r in records] == [("preempted_uncommitted", 143)]  # never "preempted"
    assert ("stopped by SIGTERM: the steps since the newest checkpoint could not be committed within --grace-period "
            "4 s: this replica was still between steps (validating") in records[0].message
    assert committed(job / "checkpoints") == []  # the first epoch's validation: nothing was committed before


def test_a_validation_pass_longer_than_the_hang_timeout_is_live_not_hung(tmp_path: Path) -> None:
    """Each validation batch beats the hang watchdog: a pass of 80 batches of 0.8 s or more (64 s) under a
    --hang-timeout of 10 s ends the job 0, where a watchdog fed only by training steps ends it 129 (``hang``). After
    this pass, freeing its iterator waited 12-13 s for tf.data's autotuning thread (``VALIDATION_TEARDOWN`` in
    entrypoint/tensorflow/callbacks.py, which the watchdog allows that phase beyond --hang-timeout): without that
    allowance this job ended 129, "stalled after step 16 while between steps (validation done; ...)"."""
    job = tmp_path / "job"
    proc = run_job([PYTHON, "-m", "entrypoint", *run_args("--module", SLOW_EVAL, "--job-dir", str(job), "--epochs", "1",
                                                          "--hang-timeout", "10", "--", "--eval-repeat", "20")],
                   tmp_path)
    assert proc.returncode == 0, tail(proc)
    assert read_records(str(job), 0) == []


@pytest.mark.slow
def test_a_stop_during_the_export_ends_at_once_and_the_restart_exports(tmp_path: Path) -> None:
    job = tmp_path / "job"
    command = [PYTHON, "-m", "entrypoint", *run_args("--module", SLOW_EVAL, "--job-dir", str(job), "--epochs", "2",
                                                     "--", "--eval-pause", "0")]
    proc = subprocess.Popen([*command, "--export-sleep", "60"], cwd=tmp_path, env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "export: sleeping" in line:  # the last step is committed, the export under way
            break
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    out, _ = proc.communicate(timeout=GRACE)
    print(f"figure: one worker, stopped in the export: exited {time.monotonic() - sent:.1f} s after SIGTERM")
    assert proc.returncode == 143, "".join(lines) + out
    record = read_records(str(job), 0)[-1]
    path = checkpoint_path(job / "checkpoints", 2 * ONE)
    assert record.failure_class == "preempted"
    assert f"after the last training step ({2 * ONE})" in record.message and f"checkpoint {path} is committed; " \
        "the model was not exported: the restart exports it" in record.message
    assert not (job / "model" / "training_summary.json").exists()
    rerun = run_job(command, tmp_path)
    assert rerun.returncode == 0, tail(rerun)
    result = summary(job / "model")
    assert result["final_step"] == 2 * ONE and result["steps_per_replica"] == [0]  # exported, nothing trained


def two_workers(out: Path, pause: str = TWO_PAUSE) -> list[str]:
    return ["local", "--workers", "2", "--output-dir", str(out), "--",
            *run_args("--module", SLOW_EVAL, "--epochs", str(EPOCHS), "--keep-checkpoints", "5", "--grace-period",
                      str(GRACE - 5), *TWO_EVAL, pause, *RESUMED)]


@pytest.fixture(scope="module")
def uninterrupted_two(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two-worker job never stopped, run once per pytest run: both tests that compare with it share it, on
    whichever xdist workers they land (tests/references.py)."""
    return reference(tmp_path_factory, "tensorflow-slow-eval-two-workers", lambda out: two_workers(out, NO_PAUSE),
                     timeout=2 * JOB_TIMEOUT).out


@pytest.mark.slow
def test_two_workers_stopped_in_validation_on_one_worker_agree_on_its_step_and_resume_bit_exact(
        tmp_path: Path, uninterrupted_two: Path) -> None:
    """SIGTERM reaches the worker only (its node is preempted); both replicas abandon the pass at the same batch,
    commit the epoch's step and exit 143, and ``local`` restarts them, as Vertex AI would."""
    out, rng = tmp_path / "out", random.Random()
    job = Job(*two_workers(out))
    try:
        nth = 1
        for attempt, epoch in enumerate(range(1, EPOCHS)):
            worker = "workerpool1-0" + (f"#{attempt}" if attempt else "")
            begun = job.wait_for(rf"^\[{re.escape(worker)}\] {nth_pass(nth)}", JOB_TIMEOUT)
            time.sleep(rng.uniform(0.5, 4.0))
            os.kill(int(begun.group(1)), signal.SIGTERM)
            sent = time.monotonic()
            for replica in ("workerpool0-0", "workerpool1-0"):
                job.wait_for(rf"\[local\] {replica} exited 143 \(retryable\): restart {attempt + 1} of", GRACE)
            exited = time.monotonic() - sent
            assert exited < GRACE
            took = job.wait_for(rf"^\[{re.escape(worker)}\] entrypoint: error: .*{COMMITTED.pattern}", 1)
            print(f"figure: two workers, SIGTERM to one in the validation pass: committed {took.group(1)} s, both "
                  f"exited {exited:.1f} s after it")
            step, path = committed(out / "checkpoints")[-1]
            assert step == epoch * TWO
            marker = read_marker(path)
            assert marker["stopped_by"] == "SIGTERM on workerpool1-0" and marker["epoch"] == epoch
            assert marker["validated"] is False  # abandoned in the pass
            nth = 2  # the restart validates that epoch again first
        assert job.wait(2 * JOB_TIMEOUT) == 0, job.output()[-4000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    output = job.output()
    agreed = re.findall(r"entrypoint: error: preempted on (workerpool\d-0), .*: stopped by SIGTERM on workerpool1-0 at "
                        r"step (\d+)", output)
    assert sorted(agreed) == sorted((r, str(e * TWO)) for r in ("workerpool0-0", "workerpool1-0")
                                    for e in range(1, EPOCHS)), agreed  # every replica, the same step, each time
    assert [r["lost_steps"] for r in summary(out / "model")["recoveries"]] == [0] * (EPOCHS - 1)
    assert_same_as(out, uninterrupted_two)


@pytest.mark.slow
def test_a_reclaim_notice_in_a_validation_pass_commits_its_step_before_the_kill_and_the_rerun_is_bit_exact(
        tmp_path: Path, uninterrupted_two: Path) -> None:
    """Two nodes, each with its own metadata server; only the worker's VM is reclaimed, while both validate epoch 2;
    the platform's SIGKILL follows within the pass, with no SIGTERM: the notice's commit is all there is."""
    chief, worker = free_ports(2)
    cluster = {"workerpool0": [f"127.0.0.1:{chief}"], "workerpool1": [f"127.0.0.1:{worker}"]}

    def node(pool: str, server: FakeMetadata, pause: str = NOTICE_PAUSE) -> Job:
        spec = {"cluster": cluster, "environment": "cloud", "task": {"type": pool, "index": 0}}
        return Job(*run_args("--module", SLOW_EVAL, "--job-dir", str(tmp_path), "--epochs", str(EPOCHS),
                             *TWO_EVAL, pause),
                   env={"CLUSTER_SPEC": json.dumps(spec), "GCE_METADATA_HOST": server.host})

    with FakeMetadata() as quiet, FakeMetadata() as reclaimed:
        nodes = [node("workerpool0", quiet), node("workerpool1", reclaimed)]
        try:
            nodes[1].wait_for(nth_pass(2), JOB_TIMEOUT)  # epoch 2's validation
            time.sleep(random.uniform(0.5, 3.0))
            reclaimed.values["instance/preempted"] = "TRUE"
            heard = time.monotonic()
            nodes[1].wait_for(r"advance notice from the platform: preempted \(instance/preempted\) on workerpool1-0: "
                              "every worker commits the newest trained step at the next batch", GRACE)
            match = nodes[0].wait_for(r"advance notice from the platform: preempted \(instance/preempted\) on "
                                      r"workerpool1-0: checkpoint of step (\d+) committed", GRACE)
            print(f"figure: two workers, a notice to one in the validation pass: committed (the chief's line) "
                  f"{time.monotonic() - heard:.1f} s after it")
            time.sleep(max(0.0, 7.0 - (time.monotonic() - heard)))  # the platform's kill, still in the pass
            for job in nodes:
                os.killpg(job.proc.pid, signal.SIGKILL)
        finally:
            for job in nodes:
                job.cleanup()
    assert int(match.group(1)) == 2 * TWO
    assert not any(re.search(r"epoch 2: .*committed", line) for line in nodes[0].lines)  # killed in the pass
    step, path = committed(tmp_path / "checkpoints")[-1]
    marker = read_marker(path)
    assert step == 2 * TWO and marker["notice"] == "preempted (instance/preempted) on workerpool1-0"
    assert marker["validated"] is False
    with FakeMetadata() as quiet:
        nodes = [node("workerpool0", quiet, NO_PAUSE), node("workerpool1", quiet, NO_PAUSE)]
        try:
            assert [job.wait(2 * JOB_TIMEOUT) for job in nodes] == [0, 0], nodes[0].output()[-4000:]
        finally:
            for job in nodes:
                job.cleanup()
    assert summary(tmp_path / "model")["start_step"] == 2 * TWO
    assert_same_as(tmp_path, uninterrupted_two)
