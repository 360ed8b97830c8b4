"""Keras 3 (``import keras``) in the TensorFlow image: across workers it cannot train, so every replica refuses it
before training, with one line saying what to write instead; on one node it trains; tf-keras across workers trains.

Keras 3's ``model.fit`` fails under MultiWorkerMirroredStrategy and ParameterServerStrategy with TensorFlow 2.21
(docs/tensorflow.md#keras-3-or-tf-keras). The scripts are ``keras3_task.py`` (the guides' style) and
``keras3_hooks.py`` (``toy_hooks`` written with Keras 3).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from entrypoint.failures import LAST_LINE_CHARS
from tests.conftest import PYTHON
from tests.runs import Job, failure_records, last_line, wait_gone
from tests.tensorflow.runs import JOB_TIMEOUT, run_job, tail

pytestmark = pytest.mark.tensorflow

TASK = str(Path(__file__).with_name("keras3_task.py"))
HOOKS = "tests.tensorflow.keras3_hooks"
# A short --timeout: nothing may wait long for a peer (the refusal comes before any collective).
RUN = ["run", "--framework", "tensorflow", "--timeout", "60", "--log-every", "1000"]
VERSIONS = r"\(keras 3\.[\w.]+\)"
SCRIPT_REFUSAL = (r"config on (workerpool\d-0), rank (\d), host \S+: --script: Keras 3 " + VERSIONS +
                  r" cannot train across workers under {strategy} with TensorFlow [\w.]+: write `import tf_keras as "
                  r"keras`, or train on one node with MirroredStrategy, or use the JAX image \(--framework jax\), "
                  r"where Keras 3 trains across nodes \(exit 2, permanent\)$")
HOOKS_MULTI = (rf"config on (workerpool\d-0), rank (\d), host \S+: --module: {HOOKS}\.build_model returned a Keras 3 "
               rf"model {VERSIONS}, which cannot train across workers under MultiWorkerMirroredStrategy with "
               r"TensorFlow [\w.]+: write `import tf_keras as keras`, or use the JAX image \(--framework jax\), where "
               r"Keras 3 trains across nodes \(exit 2, permanent\)$")
HOOKS_ONE_NODE = (rf"config on node-0, rank 0, host \S+: --module: {HOOKS}\.build_model returned a Keras 3 model "
                  rf"{VERSIONS}; the hooks loop trains tf-keras models \(TensorFlow [\w.]+\): write `import tf_keras "
                  r"as keras`, or run a Keras 3 script with --script on one node \(exit 2, permanent\)$")


def local_job(tmp_path: Path, *pools: str, run: list[str]) -> Job:
    return Job("local", *pools, "--output-dir", str(tmp_path / "out"), "--", *RUN, *run)


def refusals(output: str, pattern: str) -> dict[str, str]:
    """Each replica's refusal line (``[replica] entrypoint: error: ...``), by replica."""
    found = {}
    for line in output.splitlines():
        if (match := re.search(r"^\[(workerpool\d-0)\] entrypoint: error: (.*)$", line)) is not None:
            assert re.fullmatch(pattern, match.group(2)), line
            assert len(match.group(2)) + len("entrypoint: error: ") <= LAST_LINE_CHARS
            found[match.group(1)] = match.group(2)
    return found


def results(directory: Path) -> dict[str, dict[str, object]]:
    """What each replica that trained wrote (``keras3_task.py``), by task."""
    return {p.stem[len("result-"):]: json.loads(p.read_text()) for p in directory.glob("result-*.json")}


@pytest.mark.slow
def test_keras3_across_two_workers_is_refused_on_both_before_training(tmp_path: Path) -> None:
    job = local_job(tmp_path, "--workers", "2", run=["--script", TASK, "--", "--output-dir", str(tmp_path / "res")])
    try:
        assert job.wait(JOB_TIMEOUT) == 2, job.output()[-4000:]
        output = job.output()
        pattern = SCRIPT_REFUSAL.format(strategy="MultiWorkerMirroredStrategy")
        assert set(refusals(output, pattern)) == {"workerpool0-0", "workerpool1-0"}, output[-4000:]
        assert re.fullmatch("entrypoint: error: " + pattern, last_line(job)), last_line(job)
        assert "PerReplica" not in output and "Traceback" not in output  # Keras 3 never reached its collective
        records = failure_records(tmp_path / "out")
        assert sorted(r["replica"] for r in records) == ["workerpool0-0", "workerpool1-0"]
        assert {(r["class"], r["exit_code"]) for r in records} == {("config", 2)}
        assert results(tmp_path / "res") == {}  # nobody trained
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()


@pytest.mark.slow
def test_keras3_under_parameter_servers_is_refused_by_the_chief_and_the_servers_are_stopped(tmp_path: Path) -> None:
    """The chief refuses at fit; the script's worker and ps replicas serve in ``server.join()`` until ``local``
    stops them, as a platform ends a job whose chief failed permanently: the job ends with the chief's line."""
    job = local_job(tmp_path, "--workers", "2", "--ps", "1",
                    run=["--script", TASK, "--", "--strategy", "ps", "--output-dir", str(tmp_path / "res")])
    try:
        assert job.wait(JOB_TIMEOUT) == 2, job.output()[-4000:]
        output = job.output()
        pattern = SCRIPT_REFUSAL.format(strategy="ParameterServerStrategy")
        assert set(refusals(output, pattern)) == {"workerpool0-0"}, output[-4000:]
        assert re.fullmatch("entrypoint: error: " + pattern, last_line(job)), last_line(job)
        assert "[local] workerpool0-0 exited with 2 (permanent): stopping the others" in output
        records = failure_records(tmp_path / "out")
        assert [(r["replica"], r["class"], r["exit_code"]) for r in records] == [("workerpool0-0", "config", 2)]
        assert results(tmp_path / "res") == {}
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()


@pytest.mark.parametrize("strategy", ["multiworker", "mirrored"])
def test_keras3_on_one_node_trains(tmp_path: Path, strategy: str) -> None:
    """The guides' script unchanged on one node (a one-worker MultiWorkerMirroredStrategy, or MirroredStrategy)."""
    proc = run_job([PYTHON, "-m", "entrypoint", *RUN, "--job-dir", str(tmp_path / "job"), "--script", TASK, "--",
                    "--strategy", strategy, "--output-dir", str(tmp_path / "res")], tmp_path)
    assert proc.returncode == 0, tail(proc)
    [(task, result)] = results(tmp_path / "res").items()
    assert task == "chief-0" and result["keras"] == "keras" and str(result["version"]).startswith("3.")
    losses = result["losses"]
    assert isinstance(losses, list) and len(losses) == 2 and losses[1] < losses[0]


@pytest.mark.slow
def test_tf_keras_across_two_workers_trains_in_sync_with_keras3_imported(tmp_path: Path) -> None:
    """The fix the refusal names: the same script with ``import tf_keras as keras`` (Keras 3 imported beside it)."""
    job = local_job(tmp_path, "--workers", "2", run=["--script", TASK, "--", "--keras", "tf_keras", "--output-dir",
                                                     str(tmp_path / "res")])
    try:
        assert job.wait(JOB_TIMEOUT) == 0, job.output()[-4000:]
        found = results(tmp_path / "res")
        assert sorted(found) == ["chief-0", "worker-0"]
        chief, worker = found["chief-0"], found["worker-0"]
        assert chief["keras"] == "tf_keras" and chief["replicas_in_sync"] == 2
        assert chief["losses"] == worker["losses"] and chief["weights"] == pytest.approx(worker["weights"])
    finally:
        job.cleanup()


def test_hooks_refuse_a_keras3_model_on_one_node(tmp_path: Path) -> None:
    """The hooks loop is tf-keras (its optimizer default, TensorBoard, BackupAndRestore): refused at build_model."""
    job = tmp_path / "job"
    proc = run_job([PYTHON, "-m", "entrypoint", *RUN, "--job-dir", str(job), "--module", HOOKS], tmp_path)
    assert proc.returncode == 2, tail(proc)
    assert re.fullmatch("entrypoint: error: " + HOOKS_ONE_NODE, last_line(proc)), last_line(proc)
    assert "Traceback" not in proc.stderr
    assert [(r["class"], r["exit_code"]) for r in failure_records(job)] == [("config", 2)]
    assert not list((job / "checkpoints").glob("ckpt-*"))  # nothing trained


@pytest.mark.slow
def test_hooks_refuse_a_keras3_model_on_every_worker(tmp_path: Path) -> None:
    job = local_job(tmp_path, "--workers", "2", run=["--module", HOOKS])
    try:
        assert job.wait(JOB_TIMEOUT) == 2, job.output()[-4000:]
        assert set(refusals(job.output(), HOOKS_MULTI)) == {"workerpool0-0", "workerpool1-0"}, job.output()[-4000:]
        assert re.fullmatch("entrypoint: error: " + HOOKS_MULTI, last_line(job)), last_line(job)
        assert not list((tmp_path / "out" / "checkpoints").glob("ckpt-*"))
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()


def test_a_per_replica_repr_in_an_error_is_cut_from_the_last_line_and_kept_in_the_record(tmp_path: Path) -> None:
    """The error Keras 3 raised across workers, for real: the last line stays short, the record has it whole."""
    job = tmp_path / "job"
    script = str(Path(__file__).with_name("per_replica_error.py"))
    proc = run_job([PYTHON, "-m", "entrypoint", *RUN, "--job-dir", str(job), "--script", script], tmp_path)
    assert proc.returncode == 1, tail(proc)
    line = last_line(proc)
    assert len(line) <= LAST_LINE_CHARS, line
    assert line.startswith("entrypoint: error: user_code on node-0, rank 0, host ")
    assert ": ValueError: Attempt to convert a value (PerReplica:{" in line and " [...] " in line
    assert line.endswith("to a Tensor. (exit 1, permanent)"), line
    [record] = failure_records(job)
    assert len(record["message"]) > 2 * LAST_LINE_CHARS and "1: <tf.Tensor: shape=(8, 8)" in record["message"]
