"""What goodput is made of: the buckets, their names in ml-goodput-measurement, an attempt (docs/goodput.md)."""

from __future__ import annotations

import re
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
          "rejoin": "infrastructure_recovery",
          "startup": "program_startup"}
KILLED = "killed"  # an attempt that wrote no end: SIGKILLed, or its machine was lost
FUTURE_SLACK = 60.0  # seconds a record may be dated after now (hosts' clocks) before it is ignored as bogus
_NAMED = re.compile(r"^entrypoint: error: \S+ on ([^,]+),")  # the replica a last line names as the root cause


@dataclass(frozen=True)
class Witness:
    """A failure record of the job (``<job dir>/failures/``) as goodput reads it: when it was written, about which
    replica, the step its writer had reached, and what it says (a supervisor's record for a replica that was
    SIGKILLed and wrote nothing itself; a survivor's, whose step says how far the job had trained)."""

    t: float
    replica: str
    step: int | None
    failure_class: str
    code: int
    message: str = ""
    verdict: bool = False  # a survivor's about a peer it found gone (its supervisor's own record, if any, says more)


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
    witness: Witness | None = None  # what another process recorded of its end, when it wrote none itself

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
        """How it ended, in its own words: a node ends with its job's root cause, named when it is another
        replica's (a survivor's own failure was a consequence of it); a replica that wrote no end, as another
        process recorded it."""
        if self.running:
            return "running"
        if not self.ended and self.witness is not None:
            w = self.witness
            return f"{w.failure_class} (exit {w.code}{': ' + w.message if w.message else ''}; recorded for it)"
        if not self.ended:
            return f"{KILLED} (no end recorded: SIGKILL, or its machine was lost)"
        if self.code == 0:
            return "finished"
        named = _NAMED.match(self.line or "")
        other = f" of {named.group(1)}" if named and named.group(1) != self.replica else ""
        return f"ended by the {self.failure_class or 'failure'}{other} (exit {self.code})" if other else \
            f"{self.failure_class or 'failed'} (exit {self.code})"
