"""Hyperparameter-tuning metrics through cloudml-hypertune, written by the chief only."""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments.settings import read_settings
from entrypoint.errors import ConfigError

log = logging.getLogger("entrypoint.hypertune")


class MetricReporter:
    """Reports a tuning metric on the chief; a silent no-op on every other process.

    ``asked``: the metric was asked for (``--hypertune-metric``, the context API), not only named by the module's
    ``HYPERTUNE_METRIC`` default. Such a default is written only where something reads it: a tuning trial, or a
    metrics file the platform (or ``local``) names. Otherwise cloudml-hypertune would write it into its default
    file, ``/tmp/hypertune/output.metrics``, outside the job dir and shared by every job of the host; the training
    summary's history has it anyway.
    """

    def __init__(self, is_chief: bool, trial: str | None, asked: bool = True) -> None:
        self.wanted = asked or trial is not None or read_settings().metric_file is not None
        self.enabled = is_chief and self.wanted
        self.trial = trial
        self._client: Any = None

    def described(self, name: str | None) -> str:
        """Where the metric ``name`` went, for the run's closing line."""
        if name and not self.wanted:
            return f"{name!r} not written (not a tuning trial; --hypertune-metric writes it)"
        return f"{name!r} in {self.path}" if name and self.path else "not reported"

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
            try:
                import hypertune  # lazy: only the chief of a tuned job needs it
            except ImportError:
                if self.trial is not None:
                    raise ConfigError("cloudml-hypertune", f"not installed, so this tuning trial cannot report its "
                                      f"metric {name!r} (pip install cloudml-hypertune; the trainer images have it)"
                                      ) from None
                log.warning("cloudml-hypertune is not installed: tuning metric %r not reported (this is not a tuning "
                            "trial; pip install cloudml-hypertune to report it)", name)
                self.enabled = False
                return
            self._client = hypertune.HyperTune()
            log.info("reporting tuning metric %r to %s", name, self._client.metric_path)
        self._client.report_hyperparameter_tuning_metric(
            hyperparameter_metric_tag=name, metric_value=float(value), global_step=int(step)
        )

    def report_final(self, name: str, history: dict[str, list[float]], step: int) -> None:
        """A rerun with nothing left to train: ``name``'s last value in the job's ``history`` again, at ``step``.

        The run that trained it may have ended between its last commit and its report, or its metrics file went
        with its VM: a trial must still end with its metric."""
        if not self.enabled:
            return
        values = history.get(name) or []
        if not values:
            log.warning("tuning metric %r is not in the final checkpoint's history %s: not reported", name,
                        sorted(history))
            return
        log.info("nothing left to train: reporting tuning metric %r of the final checkpoint again", name)
        self.report(name, float(values[-1]), step)

    @property
    def path(self) -> str | None:
        """Where the metrics went (None until the first report)."""
        return None if self._client is None else str(self._client.metric_path)
