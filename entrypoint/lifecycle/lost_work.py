"""What a recovery cost: the work lost between the checkpoint a job resumed from and the failure that stopped it.

When a job resumes from a committed checkpoint, the failure records written since that checkpoint's step
was reached tell what happened: the replica that was lost (their root cause), the step the job had reached
(the survivors record theirs), and when. The loop logs one line and carries the list into later
checkpoints and the training summary (docs/OUTPUTS.md, ``recoveries``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from entrypoint import errors
from entrypoint.failures.records import read_records, root_cause


@dataclass(frozen=True)
class Recovery:
    """One resume after a failure: who was lost, where the job was, where it resumed, what that cost."""

    replica: str
    lost_at_step: int | None  # the furthest step any process reported when the job stopped
    resumed_from_step: int
    lost_steps: int | None  # steps trained again
    lost_seconds: float  # training lost: since the resumed step was reached (restart), the step in flight (in place)
    how: str = "restart"  # restart: the platform restarted processes, resumed from a checkpoint; in_place: survivors
    stalled_seconds: float | None = None  # in place: from the failure to training again (waiting for the replacement)
    cause: str | None = None  # the root cause's failure class: "preempted" when the job was stopped, not lost
    fewer_replicas_steps: int | None = None  # HSDP in place: steps trained without it (until it joined or the end)

    def line(self) -> str:
        """``recovered after losing <replica> at step N: resumed from step M (K steps, S s of training lost)``, or
        ``resumed after <replica> was preempted at step N: ...`` when the platform stopped the job (SIGTERM)."""
        where = f" at step {self.lost_at_step}" if self.lost_at_step is not None else ""
        steps = f"{self.lost_steps} steps" if self.lost_steps is not None else "steps unknown"
        if self.cause == errors.PREEMPTED:
            head = f"resumed after {self.replica} was preempted{where}"
        elif self.cause == errors.PREEMPTED_UNCOMMITTED:
            head = f"resumed after {self.replica} was preempted{where} before that step was committed"
        else:
            head = f"recovered after losing {self.replica}{where}"
        lost = f"{steps}, {self.lost_seconds:.1f} s of training lost"
        fewer = f"; {self.fewer_replicas_steps} steps trained with fewer replicas" \
            if self.fewer_replicas_steps is not None else ""
        return f"{head}: resumed from step {self.resumed_from_step} ({lost}){fewer}"

    def to_dict(self) -> dict[str, Any]:
        """For checkpoints and the training summary."""
        return asdict(self)


@dataclass(frozen=True)
class ResumePoint:
    """The committed checkpoint a process resumed from: its step, when that step was reached, the recoveries so far."""

    step: int
    reached_at: float | None
    recoveries: list[dict[str, Any]]


def reached_at() -> float:
    """The wall time a checkpoint's step was reached (stored in its marker as ``reached_at``)."""
    return time.time()


def after_resume(job_dir: str | None, step: int, reached: float | None) -> Recovery | None:
    """The recovery that resuming at ``step`` (reached at ``reached``) makes, from the records since; None if none."""
    if reached is None:
        return None
    records = [r for r in read_records(job_dir, reached) if r.time >= reached]  # no clock-skew allowance here
    cause = root_cause(records)
    if cause is None:
        return None
    steps = [r.step for r in records if isinstance(r.step, int)]
    lost_at = max(steps) if steps else None
    first = min(r.time for r in records)
    return Recovery(replica=cause.replica, lost_at_step=lost_at, resumed_from_step=step,
                    lost_steps=max(lost_at - step, 0) if lost_at is not None else None,
                    lost_seconds=round(max(first - reached, 0.0), 3), cause=cause.failure_class)
