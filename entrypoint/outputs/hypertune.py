"""Hyperparameter-tuning metrics through cloudml-hypertune, written by the chief only."""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from entrypoint.cluster import envvars as ev

log = logging.getLogger("entrypoint.hypertune")


class MetricReporter:
    """Reports a tuning metric on the chief; a silent no-op on every other process."""

    def __init__(self, is_chief: bool, trial: str | None) -> None:
        self.enabled = is_chief
        self.trial = trial
        self._client: Any = None

    def report(self, name: str, value: float, step: int) -> None:
        """Append ``name=value`` at ``step`` to the hypertune metrics file (chief only)."""
        if not self.enabled:
            return
        if not math.isfinite(value):
            log.warning("tuning metric %r is %s at step %d: not reported", name, value, step)
            return
        if self._client is None:
            if self.trial is not None:
                os.environ[ev.CLOUD_ML_TRIAL_ID] = self.trial  # cloudml-hypertune reads it from here
            import hypertune  # lazy: only the chief of a tuned job needs it

            self._client = hypertune.HyperTune()
            log.info("reporting tuning metric %r to %s", name, self._client.metric_path)
        self._client.report_hyperparameter_tuning_metric(
            hyperparameter_metric_tag=name, metric_value=float(value), global_step=int(step)
        )

    @property
    def path(self) -> str | None:
        """Where the metrics went (None until the first report)."""
        return None if self._client is None else str(self._client.metric_path)
