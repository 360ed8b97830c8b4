"""Without cloudml-hypertune (a machine other than our images): a job that is not a tuning trial trains on and says
the metric was not reported; a tuning trial fails with one line naming the package, not a traceback."""

from __future__ import annotations

import logging
import sys

import pytest

from entrypoint.errors import ConfigError
from entrypoint.outputs.hypertune import MetricReporter


@pytest.fixture
def no_hypertune(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hypertune", None)  # import hypertune raises ImportError


@pytest.mark.usefixtures("no_hypertune")
def test_outside_a_tuning_trial_the_metric_is_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    reporter = MetricReporter(is_chief=True, trial=None)
    with caplog.at_level(logging.WARNING):
        reporter.report("accuracy", 0.9, 10)
        reporter.report("accuracy", 0.95, 20)
    assert [r.getMessage() for r in caplog.records] == [
        "cloudml-hypertune is not installed: tuning metric 'accuracy' not reported (this is not a tuning trial; "
        "pip install cloudml-hypertune to report it)"]
    assert reporter.path is None


@pytest.mark.usefixtures("no_hypertune")
def test_a_tuning_trial_without_the_package_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"cloudml-hypertune: not installed, so this tuning trial cannot report"):
        MetricReporter(is_chief=True, trial="7").report("accuracy", 0.9, 10)
