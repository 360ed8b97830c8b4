"""A rerun at the final checkpoint (the chief restarted after the last commit) trains nothing, and still ends with
the whole summary and the tuning metric: the checkpoint's marker carries the job's per-epoch metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import PYTHON, skip_unless_installed
from tests.tensorflow.runs import TOY, run_args, run_job, summary, tail

skip_unless_installed("tensorflow")
pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]


def reported(metrics_file: Path) -> list[tuple[float, int]]:
    """The tuning metric's (value, step) lines cloudml-hypertune wrote."""
    lines = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    return [(float(line["val_accuracy"]), int(line["global_step"])) for line in lines]


def test_a_rerun_at_the_final_checkpoint_keeps_the_summary_and_reports_the_metric_again(tmp_path: Path) -> None:
    job, metrics_file = tmp_path / "job", tmp_path / "output.metrics"
    command = [PYTHON, "-m", "entrypoint", *run_args("--module", TOY, "--job-dir", str(job), "--hypertune-metric",
                                                      "val_accuracy")]
    env = {"CLOUD_ML_HP_METRIC_FILE": str(metrics_file)}
    first = run_job(command, tmp_path, env)
    assert first.returncode == 0, tail(first)
    trained = summary(job / "model")
    assert trained["final_step"] == 32 and len(trained["history"]["val_accuracy"]) == 2, trained
    assert set(trained["metrics"]) == {"loss", "accuracy"}
    assert reported(metrics_file)[-1] == (pytest.approx(trained["metrics"]["accuracy"], abs=1e-6), 32)

    # The chief's VM is gone after the last commit: its metrics file with it, and the summary was not written.
    metrics_file.unlink()
    (job / "model" / "training_summary.json").unlink()
    rerun = run_job(command, tmp_path, env)
    assert rerun.returncode == 0, tail(rerun)
    again = summary(job / "model")
    assert again["start_step"] == again["final_step"] == 32 and again["steps_per_replica"] == [0], again
    assert again["metrics"] == pytest.approx(trained["metrics"]) and again["metrics"], again
    assert set(again["history"]) == set(trained["history"]), again
    assert all(again["history"][k] == pytest.approx(v) for k, v in trained["history"].items()), again
    assert reported(metrics_file) == [(pytest.approx(trained["metrics"]["accuracy"], abs=1e-6), 32)]
