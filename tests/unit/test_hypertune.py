"""The tuning metric: written by the chief only, never when it is not a finite number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entrypoint.outputs.hypertune import MetricReporter

pytest.importorskip("hypertune")


def test_a_non_finite_metric_is_not_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    metrics = tmp_path / "output.metrics"
    monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(metrics))
    reporter = MetricReporter(is_chief=True, trial="4")
    reporter.report("accuracy", float("nan"), 10)
    reporter.report("accuracy", float("inf"), 11)
    reporter.report("accuracy", 0.75, 12)
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [(line["accuracy"], line["global_step"]) for line in lines] == [("0.75", "12")]
    assert "tuning metric 'accuracy' is nan at step 10: not reported" in caplog.text


def test_only_the_chief_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = tmp_path / "output.metrics"
    monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(metrics))
    MetricReporter(is_chief=False, trial=None).report("accuracy", 0.5, 1)
    assert not metrics.exists()
