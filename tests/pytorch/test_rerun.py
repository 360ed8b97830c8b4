"""A rerun at the final checkpoint (the chief restarted after the last commit) trains nothing, and still reports the
tuning metric: a Vertex trial whose metrics file went with its VM ends with its metric."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runs import entrypoint, failure_text, summary

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]


def reported(metrics_file: Path) -> list[tuple[float, int]]:
    """The tuning metric's (value, step) lines cloudml-hypertune wrote."""
    lines = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    return [(float(line["accuracy"]), int(line["global_step"])) for line in lines]


def test_a_rerun_at_the_final_checkpoint_reports_the_tuning_metric_again(tmp_path: Path) -> None:
    job, metrics_file = tmp_path / "job", tmp_path / "output.metrics"
    args = ["run", "--framework", "pytorch", "--timeout", "30", "--job-dir", str(job), "--module",
            "tests.pytorch.faults", "--epochs", "1", "--hypertune-metric", "accuracy"]
    env = {"CLOUD_ML_HP_METRIC_FILE": str(metrics_file)}
    first = entrypoint(*args, env=env)
    assert first.returncode == 0, failure_text(first)
    trained = summary(job / "model")
    final = (pytest.approx(trained["metrics"]["accuracy"], abs=1e-6), trained["final_step"])
    assert reported(metrics_file) == [final]

    metrics_file.unlink()  # the chief's VM is gone after the last commit, its metrics file with it
    rerun = entrypoint(*args, env=env)
    assert rerun.returncode == 0, failure_text(rerun)
    again = summary(job / "model")
    assert again["start_step"] == again["final_step"] == trained["final_step"], again
    assert again["metrics"] == pytest.approx(trained["metrics"]), again
    assert reported(metrics_file) == [final]
    assert again["hypertune_file"] == str(metrics_file)
