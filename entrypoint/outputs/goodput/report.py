"""The goodput report (``goodput.py`` computes it): text, JSON, the one line, and the timeline for ``--plot``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from entrypoint.outputs.goodput.model import BUCKETS, ML_GOODPUT, Attempt


@dataclass
class Report:
    """The job's goodput: buckets (seconds, adding up to ``wall``), counts, and the timeline for a plot."""

    job_dir: str
    start: float
    end: float
    provisional: bool
    buckets: dict[str, float]
    attempts: list[Attempt]
    disruptions: dict[str, int]
    steps_productive: int
    steps_lost: int
    final_step: int
    lanes: list[dict[str, Any]]
    warnings: list[str]
    steps_fewer_replicas: int = 0  # HSDP's survivors trained them without a lost node (its share skipped)

    @property
    def wall(self) -> float:
        return max(self.end - self.start, 0.0)

    @property
    def goodput(self) -> float:
        return 100.0 * self.buckets["productive"] / self.wall if self.wall > 0 else 0.0

    @property
    def job_attempts(self) -> int:
        """The chief's attempts (each replica's are in ``attempts``)."""
        return sum(1 for a in self.attempts if a.chief) or len(self.attempts)

    @property
    def disruption_count(self) -> int:
        return sum(self.disruptions.values())

    @property
    def mean_time_between_disruptions(self) -> float | None:
        running = self.wall - self.buckets["scheduling"]
        return running / self.disruption_count if self.disruption_count else None

    def why_none(self) -> str | None:
        """Why no second trained the model, when none did (None otherwise)."""
        if self.buckets["productive"] > 0:
            return None
        if not self.attempts:
            return "no attempt was recorded"
        if self.steps_lost and not self.steps_productive:
            return f"every step trained was lost ({_n(self.steps_lost, 'step')}, none kept by a committed checkpoint)"
        if not self.steps_productive:
            return ("no training step was recorded (the hooks loops record theirs; a script reports its own with "
                    "entrypoint.context.step_done(step))")
        return "its steps' time is unknown (their records were not written)"

    def line(self) -> str:
        """One line: what ``local`` prints at the end and the summary's ``goodput.line``."""
        worst = sorted(((v, k) for k, v in self.buckets.items() if k != "productive" and v > 0), reverse=True)[:3]
        badput = ", ".join(f"{name} {seconds:.1f} s" for seconds, name in worst) or "none"
        why = self.why_none()
        return (f"goodput {self.goodput:.1f}%{' (provisional: the job is running)' if self.provisional else ''}: "
                f"{self.buckets['productive']:.1f} s of {self.wall:.1f} s trained the model"
                f"{f' ({why})' if why else ''}; "
                f"{_n(self.job_attempts, 'attempt')}, {_n(self.disruption_count, 'disruption')}, "
                f"{_n(self.steps_lost, 'step')} lost; "
                f"largest badput: {badput}")

    def to_dict(self) -> dict[str, Any]:
        mtbd = self.mean_time_between_disruptions
        return {
            "job_dir": self.job_dir, "provisional": self.provisional, "start": round(self.start, 3),
            "end": round(self.end, 3), "wall_seconds": round(self.wall, 3), "goodput_percent": round(self.goodput, 2),
            "buckets": {k: round(v, 3) for k, v in self.buckets.items()},
            "badput_percent": {k: round(100 * v / self.wall, 2) if self.wall else 0.0 for k, v in self.buckets.items()
                               if k != "productive"},
            "ml_goodput_names": dict(ML_GOODPUT),
            "job_attempts": self.job_attempts,
            "attempts": [{"attempt": a.id, "replica": a.replica, "chief": a.chief, "start": round(a.start, 3),
                          "end": round(a.end, 3), "end_recorded": a.ended, "cause": a.cause(),
                          "startup_seconds": None if a.startup is None else round(a.startup, 3)}
                         for a in self.attempts],
            "disruptions": dict(self.disruptions), "disruption_count": self.disruption_count,
            "mean_time_between_disruptions_seconds": None if mtbd is None else round(mtbd, 1),
            "steps": {"productive": self.steps_productive, "lost": self.steps_lost, "final": self.final_step,
                      "fewer_replicas": self.steps_fewer_replicas},
            "warnings": list(self.warnings), "line": self.line(),
        }

    def text(self) -> str:
        """The ``goodput`` command's report."""
        lines = [f"job {self.job_dir}: {self.line()}", "",
                 f"wall time {self.wall:.1f} s, {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(self.start))} to "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(self.end))} UTC"
                 f"{' (now: provisional)' if self.provisional else ''}", ""]
        width = max(len(k) for k in BUCKETS)
        for name in BUCKETS:
            seconds = self.buckets[name]
            share = 100 * seconds / self.wall if self.wall else 0.0
            also = f"  ({ML_GOODPUT[name]})" if name in ML_GOODPUT else ""
            lines.append(f"  {name:<{width}}  {seconds:10.1f} s  {share:5.1f}%{also}")
        lines.append(f"  {'total':<{width}}  {sum(self.buckets.values()):10.1f} s")
        lines += ["", f"steps: {self.steps_productive} productive (final step {self.final_step}), "
                      f"{self.steps_lost} lost to disruptions"
                      + (f", {self.steps_fewer_replicas} trained with fewer replicas (a lost node's share skipped)"
                         if self.steps_fewer_replicas else "")]
        mtbd = self.mean_time_between_disruptions
        by_class = ", ".join(f"{k} {v}" for k, v in sorted(self.disruptions.items())) or "none"
        lines.append(f"disruptions: {self.disruption_count} ({by_class})"
                     + (f"; mean time between them {mtbd:.1f} s" if mtbd is not None else ""))
        lines.append(f"attempts: {self.job_attempts} of the chief; every replica's runs:")
        names = [f"{a.replica}{' (chief)' if a.chief else ''}:" for a in self.attempts]
        starts = [f"+{a.start - self.start:.1f}" for a in self.attempts]
        name_width, start_width = max(map(len, names), default=0), max(map(len, starts), default=0)
        for a, name, start in zip(self.attempts, names, starts, strict=True):  # in columns, whatever the names
            lines.append(f"  {name:<{name_width}} {a.end - a.start:8.1f} s from {start:>{start_width}} s, {a.cause()}"
                         + ("" if a.startup is None else f"; start-up through its first step {a.startup:.1f} s"))
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def timeline(self) -> dict[str, Any]:
        """What ``--plot`` draws (``plot.py``)."""
        return {"title": f"job {self.job_dir}: goodput {self.goodput:.1f}%"
                         f"{' (provisional)' if self.provisional else ''}",
                "start": self.start, "end": self.end, "lanes": self.lanes,
                "buckets": {k: self.buckets[k] for k in BUCKETS}}


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
