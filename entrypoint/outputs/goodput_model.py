"""What goodput is made of: the buckets, their names in ml-goodput-measurement, an attempt (docs/goodput.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BUCKETS = ("productive", "program_startup", "training_preparation", "data_loading", "checkpoint_save",
           "checkpoint_restore", "wasted_progress", "infrastructure_recovery", "scheduling", "evaluation", "export",
           "other")
ML_GOODPUT = {"program_startup": "PROGRAM_STARTUP", "training_preparation": "TRAINING_PREP",
              "data_loading": "DATA_LOADING_SYNC", "checkpoint_save": "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
              "checkpoint_restore": "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
              "wasted_progress": "WASTED_PROGRESS_FROM_DISRUPTION",
              "infrastructure_recovery": "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
              "evaluation": "CUSTOM_BADPUT_EVENTS", "export": "CUSTOM_BADPUT_EVENTS", "other": "OTHER"}
PHASES = {"preparation": "training_preparation", "restore": "checkpoint_restore", "checkpoint": "checkpoint_save",
          "evaluation": "evaluation", "export": "export", "recovery": "infrastructure_recovery",
          "startup": "program_startup"}
KILLED = "killed"  # an attempt that wrote no end: SIGKILLed, or its machine was lost


@dataclass
class Attempt:
    """One run of the ``run`` command on one replica."""

    id: str
    replica: str
    chief: bool
    start: float
    end: float
    ended: bool  # an ``end`` record says how it ended (else: the last record it wrote, or now while it runs)
    code: int | None = None
    failure_class: str | None = None
    line: str | None = None
    running: bool = False
    job: str | None = None
    training: list[dict[str, Any]] = field(default_factory=list)  # its chief training process's records

    @property
    def disrupted(self) -> bool:
        return not self.running and (not self.ended or self.code != 0)

    @property
    def startup(self) -> float | None:
        """Seconds from the attempt's start to the end of its training's first step (imports, the process group,
        preparation, the restore, compilation); None where its records show no first step."""
        ends = [float(r["first_step_end"]) for r in self.training if r["kind"] == "progress" and "first_step_end" in r]
        return min(ends) - self.start if ends else None

    def cause(self) -> str:
        if self.running:
            return "running"
        if not self.ended:
            return f"{KILLED} (no end recorded: SIGKILL, or its machine was lost)"
        return "finished" if self.code == 0 else f"{self.failure_class or 'failed'} (exit {self.code})"
