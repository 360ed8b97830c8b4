"""ParameterServerStrategy (chief + workers + ps all exit 0) and the evaluator sidecar."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entrypoint.outputs.checkpoints import committed, read_marker
from tests.tensorflow.runs import TOY, leftovers, local_command, run_args, run_job, summary, tail

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]


def test_parameter_server_job_trains_and_every_replica_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_job(local_command(out, "--workers", "3", "--ps", "1", run=run_args("--module", TOY)), tmp_path)
    assert proc.returncode == 0, tail(proc)  # the emulator exits 0 only when every replica did
    result = summary(out / "model")
    assert result["strategy"] == "ParameterServerStrategy"
    assert result["final_step"] == 32  # 2 epochs x ceil(256 / 16) steps scheduled on the workers
    assert (out / "model" / "saved_model.pb").is_file()
    assert [step for step, _ in committed(out / "checkpoints")] == [16, 32]
    assert (out / "checkpoints" / "TRAINING_DONE").is_file()
    assert leftovers(tmp_path) == []
    goodput = result["goodput"]  # the job ledger: the coordinator's steps, as Keras schedules them on the workers
    assert goodput["buckets"]["productive"] > 0 and goodput["attempts"] == 1, goodput


def test_evaluator_evaluates_committed_checkpoints_without_blocking_training(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_job(local_command(out, "--workers", "1", "--evaluators", "1",
                                 run=run_args("--module", TOY, "--epochs", "3")), tmp_path)
    assert proc.returncode == 0, tail(proc)
    result = summary(out / "model")
    assert result["final_step"] == 48  # training completed on its own schedule
    lines = [json.loads(line) for line in (out / "logs" / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert lines, "the evaluator evaluated no checkpoint"
    assert lines[-1]["step"] == 48  # it finishes with the final checkpoint
    for line in lines:  # the evaluator's numbers are the chief's validation numbers for that checkpoint
        assert line["loss"] == pytest.approx(result["history"]["val_loss"][line["epoch"] - 1], rel=1e-4)
        if Path(line["checkpoint"]).exists():
            assert read_marker(line["checkpoint"])["step"] == line["step"]
    assert list((out / "logs" / "eval").glob("events.out.tfevents.*"))
    assert not (out / ".replicas" / "workerpool3-0" / "hypertune" / "output.metrics").exists()
