"""Where a job's hours went, read from its ledger (``ledger.py``): goodput and badput buckets (docs/goodput.md).

The job's wall time runs from its first attempt's start to its last attempt's end (now, for a running job: the
report is provisional). Every second of it lands in exactly one bucket, so the buckets add up to the wall time:

- ``scheduling``: no attempt of any replica ran (the platform was placing or restarting the job);
- the chief's attempts, from its records: ``program_startup`` (the process's start to the loop's first activity,
  plus the first step's time beyond a typical step: imports, compilation), ``training_preparation`` (datasets,
  model, optimizer), ``checkpoint_restore``, ``data_loading`` (the steps' waits for a batch), ``checkpoint_save``
  (the training blocked by a save), ``evaluation``, ``export``, ``productive`` (steps that are part of the final
  durable progress, each counted once), ``wasted_progress`` (steps trained again after a disruption: the replayed
  copy is productive, the lost one is not), ``infrastructure_recovery`` (in-place recoveries; an attempt's end
  after its last record when a disruption ended it; replicas running while the chief was being restarted),
  ``other`` (what no record covers);
- the names follow ml-goodput-measurement's badput types where they mean the same (``ML_GOODPUT``).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from entrypoint.outputs.goodput.ledger import Read
from entrypoint.outputs.goodput.model import BUCKETS, FUTURE_SLACK, KILLED, PHASES, Attempt, Witness
from entrypoint.outputs.goodput.report import Report

log = logging.getLogger("entrypoint")

IN_PLACE = "peer_lost (recovered in place)"
PLATFORM = ("submitted", "job_end")  # records of the platform itself (``local``), of no attempt
_SKEW = 1.0  # seconds a failure record may be dated before the last record of the attempt it is about
# Who reads the job's failure records for ``of_job`` (``lifecycle/recorder.py`` registers the reader: failures/ is a
# layer above this one): job dir -> its failure records as witnesses.
_witness_sources: list[Callable[[str], list[Witness]]] = []


def add_witness_source(source: Callable[[str], list[Witness]]) -> None:
    """Read the job's failure records with ``source`` in ``of_job`` from now on."""
    if source not in _witness_sources:
        _witness_sources.append(source)


@dataclass
class Span:
    t0: float
    t1: float
    bucket: str


@dataclass
class Segment:
    """Steps ``first``..``last`` of a ``progress`` record: ``live`` until a restore rolls them back."""

    attempt: Attempt
    t0: float
    t1: float
    first: int
    last: int
    steps: int
    data: float
    extra: float  # the first step's time beyond a typical one
    wasted_steps: float = 0.0  # rolled back (a fraction of a segment when a restore lands inside it)

    @property
    def train_seconds(self) -> float:
        return max(self.t1 - self.t0 - self.data - self.extra, 0.0)

    @property
    def wasted_fraction(self) -> float:
        return min(self.wasted_steps / self.steps, 1.0) if self.steps else 0.0


def attempts_of(read: Read, now: float, running: bool, witnesses: Sequence[Witness] = ()) -> list[Attempt]:
    """The attempts the ledger knows, oldest first; a training record's attempt without a ``start`` still counts.
    One that wrote no ``end`` ended where a failure record about its replica says (its supervisor's, else a
    survivor's verdict), else at its last record (a replica other than the chief: when its replacement started, at
    the latest)."""
    found: dict[str, Attempt] = {}
    last_seen: dict[str, float] = {}
    for r in read.records:
        if r["kind"] in PLATFORM:
            continue
        key = str(r.get("attempt"))
        last_seen[key] = max(last_seen.get(key, 0.0), float(r["t"]), float(r.get("t1", 0.0)))
        if r["kind"] == "start" and key not in found:
            found[key] = Attempt(key, str(r.get("replica")), bool(r.get("chief")), float(r["t"]), float(r["t"]),
                                 False, job=r.get("job"))
    for r in (r for r in read.records if r["kind"] not in PLATFORM):
        key = str(r.get("attempt"))
        attempt = found.get(key)
        if attempt is None:  # its node's start was not written (a store that failed then): from its first record
            attempt = found[key] = Attempt(key, str(r.get("replica")), r.get("rank") == 0, float(r["t"]),
                                           float(r["t"]), False)
        if r["kind"] == "end":
            attempt.ended, attempt.end = True, float(r["t"])
            attempt.code, attempt.failure_class, attempt.line = r.get("code"), r.get("failure_class"), r.get("line")
        elif r["kind"] not in ("start",) and r.get("rank") is not None:
            attempt.training.append(r)
            attempt.chief = attempt.chief or r.get("rank") == 0
    ordered = sorted(found.values(), key=lambda a: a.start)
    for a in ordered:
        if not a.ended:
            a.end = max(last_seen.get(a.id, a.start), a.start)
            later = min((b.start for b in ordered if b.replica == a.replica and b.start > a.start), default=None)
            about = [w for w in witnesses if w.replica == a.replica and w.t >= max(a.start, a.end - _SKEW)
                     and (later is None or w.t <= later + _SKEW)]
            # what its supervisor saw (its exit status) before a survivor's verdict, which can come first (a liveness
            # port's refusal names a killed process at once)
            a.witness = next((w for w in about if not w.verdict), about[0] if about else None)
            if a.witness is not None:
                a.end = max(a.end, min(a.witness.t, later if later is not None else a.witness.t))
            elif later is not None and not a.chief:
                # A replica other than the chief writes only its start and end: one that wrote no end ran until its
                # replacement started, at the latest (the chief's training records bound its own end more closely).
                a.end = max(a.end, later)
    if running:  # the newest attempt of each replica that did not end is still running
        newest: dict[str, Attempt] = {}
        for a in ordered:
            newest[a.replica] = a
        for a in newest.values():
            if not a.ended:
                a.running, a.end = True, max(now, a.end)
    return ordered


def _union(attempts: list[Attempt]) -> list[tuple[float, float]]:
    spans: list[tuple[float, float]] = []
    for a in sorted(attempts, key=lambda a: a.start):
        if spans and a.start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], a.end))
        else:
            spans.append((a.start, a.end))
    return spans


def _segments(attempt: Attempt) -> list[Segment]:
    progress = [r for r in attempt.training if r["kind"] == "progress"]
    steps = sum(int(r.get("steps", 0)) for r in progress)
    seconds = sum(float(r.get("step_seconds", 0.0)) for r in progress)
    first = next((float(r["first_step_seconds"]) for r in progress if "first_step_seconds" in r), None)
    typical = (seconds - first) / (steps - 1) if first is not None and steps > 1 else first or 0.0
    out = []
    for r in progress:
        extra = max(float(r["first_step_seconds"]) - typical, 0.0) if "first_step_seconds" in r else 0.0
        out.append(Segment(attempt, float(r["t0"]), float(r["t1"]), int(r["first"]), int(r["last"]),
                           int(r.get("steps", 0)), float(r.get("data_seconds", 0.0)), extra))
    return out


def _roll_back(live: list[Segment], step: int) -> None:
    """A restore to ``step``: every step trained after it is lost (kept in ``live`` as wasted)."""
    for seg in live:
        if seg.last <= step:
            continue
        lost = seg.last - max(step, seg.first - 1)
        seg.wasted_steps = max(seg.wasted_steps, float(min(lost, seg.steps)))


def _in_future(read: Read, now: float) -> Read:
    """The ledger less its records dated after now (a host's clock ahead, a record written by hand), with a warning:
    one such record would otherwise stretch the job's wall time to its date."""
    def latest(r: dict[str, Any]) -> float:
        return max((float(r[k]) for k in ("t", "t0", "t1") if isinstance(r.get(k), (int, float))), default=0.0)

    ahead = [r for r in read.records if latest(r) > now + FUTURE_SLACK]
    if not ahead:
        return read
    writers = ", ".join(sorted({str(r.get("replica")) for r in ahead}))
    warning = (f"{len(ahead)} record(s) of {writers} dated up to {max(map(latest, ahead)) - now:.0f} s after now "
               "ignored (a clock ahead on the host that wrote them?)")
    return Read([r for r in read.records if latest(r) <= now + FUTURE_SLACK], [*read.warnings, warning], read.files)


def compute(read: Read, job_dir: str, now: float | None = None, running: bool = False,
            witnesses: Sequence[Witness] = ()) -> Report:
    """The job's goodput from its ledger (``running``: the job holds its job dir now; the report is provisional) and
    its failure records (``witnesses``: how far it had trained, when a replica that wrote no end ended)."""
    now = time.time() if now is None else now
    read = _in_future(read, now)
    witnesses = sorted((w for w in witnesses if w.t <= now + FUTURE_SLACK), key=lambda w: w.t)
    attempts = attempts_of(read, now, running, witnesses)
    buckets = dict.fromkeys(BUCKETS, 0.0)
    if not attempts:
        return Report(job_dir, now, now, running, buckets, [], {}, 0, 0, 0, [], list(read.warnings))
    start, end = min(a.start for a in attempts), max(a.end for a in attempts)
    chiefs = [a for a in attempts if a.chief]
    job_lane = _outside_chief(attempts, chiefs, buckets)
    lanes: list[dict[str, Any]] = [{"label": "job", "spans": job_lane, "marks": []}]
    for r in read.records:  # the platform's submissions and ends (``local``): its own waits are scheduling
        if r["kind"] in PLATFORM and (float(r["t"]) < start or (float(r["t"]) > end and not running)):
            t0, t1 = sorted((float(r["t"]), start if float(r["t"]) < start else end))
            buckets["scheduling"] += t1 - t0
            job_lane.append({"t0": t0, "t1": t1, "bucket": "scheduling"})
            start, end = min(start, t0), max(end, t1)
    live = _progress(chiefs, attempts, witnesses)
    by_attempt: dict[str, list[Segment]] = {}
    for seg in live:
        by_attempt.setdefault(seg.attempt.id, []).append(seg)
    disruptions: dict[str, int] = {}
    chief_end = start  # a chief attempt's time counts from the previous one's end (two overlap in a grace period)
    for a in attempts:
        lanes.append(_lane(a, start, by_attempt.get(a.id, []), buckets, disruptions, chief_end))
        chief_end = max(chief_end, a.end) if a.chief else chief_end
    buckets["other"] += max((end - start) - sum(buckets.values()), 0.0)
    warnings = list(read.warnings)
    if chiefs and not live:
        warnings.append("no training step was recorded: the hooks loops record theirs; a script reports its own with "
                        "entrypoint.context.step_done(step), else its time is 'other'")
    final = max((int(r.get("step", -1)) for a in chiefs for r in a.training if r["kind"] == "training_end"),
                default=max((s.last for s in live), default=0))
    return Report(job_dir, start, end, running or any(a.running for a in attempts), buckets, attempts, disruptions,
                  round(sum(s.steps - s.wasted_steps for s in live)), round(sum(s.wasted_steps for s in live)),
                  max(final, 0), lanes, warnings, sum(int(r.get("steps", 0)) for a in chiefs
                                                      for r in a.training if r["kind"] == "fewer_replicas"))


def _outside_chief(attempts: list[Attempt], chiefs: list[Attempt], buckets: dict[str, float]
                   ) -> list[dict[str, Any]]:
    """The job's time no chief attempt covers: ``scheduling`` where no replica ran; where others ran, the chief's
    ``program_startup`` before it first started, ``infrastructure_recovery`` while it was being restarted."""
    covered, chief_cover = _union(attempts), _union(chiefs)
    spans = [Span(a1, b0, "scheduling") for (_, a1), (b0, _) in itertools.pairwise(covered) if b0 > a1]
    buckets["scheduling"] = sum(s.t1 - s.t0 for s in spans)
    first_chief = min((a.start for a in chiefs), default=covered[-1][1])
    for c0, c1 in covered:
        cursor = c0
        for k0, k1 in [*chief_cover, (c1, c1)]:
            lo, hi = max(cursor, c0), min(k0, c1)
            if hi > lo:
                bucket = "program_startup" if hi <= first_chief else "infrastructure_recovery"
                buckets[bucket] += hi - lo
                spans.append(Span(lo, hi, bucket))
            cursor = max(cursor, k1)
    return [s.__dict__ for s in sorted(spans, key=lambda s: s.t0)]


def _progress(chiefs: list[Attempt], attempts: list[Attempt], witnesses: Sequence[Witness]) -> list[Segment]:
    """Every progress segment of the chief's attempts, with what restores rolled back marked wasted (a restore
    within an attempt, ``in_place``: FSDP's survivors rolled back to a snapshot in peer memory, rolls back its own
    segments before it too). A job that ended without finishing (not running) also loses what its newest commit
    does not hold."""
    live: list[Segment] = []
    committed, finished = 0, False
    for a in chiefs:
        mine = _segments(a)
        for r in sorted(a.training, key=lambda r: float(r.get("t0", r["t"]))):
            if r["kind"] == "restored":
                at = float(r.get("t0", r["t"])) if r.get("in_place") else float("-inf")
                _roll_back([*live, *(s for s in mine if s.t1 <= at)], int(r.get("step", 0)))
            elif r["kind"] == "committed":
                committed = max(committed, int(r.get("step", 0)))
            elif r["kind"] == "training_end" and r.get("outcome") == "finished":
                finished = True
        live.extend(mine)
        live.extend(_unrecorded(a, live, attempts, witnesses))
    if chiefs and not finished and not chiefs[-1].running:
        _roll_back(live, committed)
    return live


def _unrecorded(a: Attempt, live: list[Segment], attempts: list[Attempt],
                witnesses: Sequence[Witness]) -> list[Segment]:
    """The steps a disrupted chief attempt trained after its last ``progress`` record (killed before it wrote the
    next one; before its first, say), as far as a record shows it reached: a commit, its training's end, or a
    failure record written while it ran (a survivor records the step the job had reached). Their time is unknown:
    a segment of no duration, whose steps count as productive or, once a restore rolls them back, as lost."""
    if not a.disrupted:
        return []
    # until the next chief attempt trains (a survivor may notice the loss after the replacement started)
    until = min((float(r["t"]) for b in attempts if b.chief and b.start > a.start for r in b.training),
                default=a.end + _SKEW)
    reached = [int(r["step"]) for r in a.training if r["kind"] in ("committed", "training_end")
               and isinstance(r.get("step"), int)]
    reached += [w.step for w in witnesses if w.step is not None and a.start <= w.t <= until]
    recorded = max((s.last for s in live if s.attempt is a), default=max(
        (int(r.get("step", 0)) for r in a.training if r["kind"] == "restored"), default=0))
    top = max(reached, default=recorded)
    if top <= recorded:
        return []
    return [Segment(a, a.end, a.end, recorded + 1, top, top - recorded, 0.0, 0.0)]


def _lane(a: Attempt, start: float, segments: list[Segment], buckets: dict[str, float],
          disruptions: dict[str, int], after: float) -> dict[str, Any]:
    """An attempt's lane: a chief's time in buckets (added to ``buckets``), another replica's as one span; its
    disruptions counted into ``disruptions``."""
    marks: list[dict[str, Any]] = []
    if a.chief:
        spans = _attempt_spans(a, segments, buckets, after)
        if a.disrupted:
            cls = str(a.failure_class if a.ended else a.witness.failure_class if a.witness else KILLED)
            disruptions[cls] = disruptions.get(cls, 0) + 1
        for r in a.training:
            if r["kind"] == "phase" and r.get("name") == "recovery":
                disruptions[IN_PLACE] = disruptions.get(IN_PLACE, 0) + 1
                marks.append({"t": float(r["t0"]), "text": "lost a peer: recovered in place"})
    else:
        spans = [{"t0": a.start, "t1": a.end, "bucket": "replica"}]
    if a.disrupted:
        marks.append({"t": a.end, "text": a.cause()})
    return {"label": f"{a.replica}{' (chief)' if a.chief else ''} from +{a.start - start:.0f} s", "spans": spans,
            "marks": marks}


def _attempt_spans(a: Attempt, segments: list[Segment], buckets: dict[str, float], after: float
                   ) -> list[dict[str, Any]]:
    """The chief attempt's time from ``after`` on (an earlier chief's end) split into buckets (added to ``buckets``):
    its lane's spans."""
    pieces: list[tuple[float, float, str | Segment]] = []
    for r in a.training:
        if r["kind"] == "phase":
            pieces.append((float(r["t0"]), float(r["t1"]), PHASES.get(str(r.get("name")), "other")))
    pieces += [(s.t0, s.t1, s) for s in segments]
    pieces.sort(key=lambda p: p[0])
    spans: list[dict[str, Any]] = []

    def put(t0: float, t1: float, bucket: str) -> None:
        if t1 > t0:
            buckets[bucket] += t1 - t0
            spans.append({"t0": t0, "t1": t1, "bucket": bucket})

    cursor = begin = max(a.start, after)
    for t0, t1, what in pieces:
        t0, t1 = max(t0, cursor), min(t1, a.end)
        if t1 <= t0:
            continue
        put(cursor, t0, "program_startup" if cursor == begin else "other")
        if isinstance(what, Segment):
            scale = (t1 - t0) / max(what.t1 - what.t0, 1e-9)  # a segment cut at the attempt's end
            data, extra = what.data * scale, what.extra * scale
            train = max(t1 - t0 - data - extra, 0.0)
            wasted = train * what.wasted_fraction
            at = t0
            for seconds, bucket in ((extra, "program_startup"), (data, "data_loading"),
                                    (train - wasted, "productive"), (wasted, "wasted_progress")):
                put(at, at + seconds, bucket)
                at += seconds
        else:
            put(t0, t1, what)
        cursor = t1
    put(cursor, max(a.end, cursor), "infrastructure_recovery" if a.disrupted and pieces else "other")
    return spans


def of_job(job_dir: str, running: bool = False, now: float | None = None) -> Report:
    """The job's goodput from the ledger under ``job_dir`` (and its failure records, where a reader is registered)."""
    from entrypoint.outputs.goodput import ledger

    witnesses = [w for source in _witness_sources for w in source(job_dir)]
    return compute(ledger.read(job_dir), job_dir, now, running, witnesses)


def so_far(job_dir: str) -> dict[str, Any]:
    """The job's goodput so far, for the training summary of the attempt that ends now (docs/OUTPUTS.md)."""
    try:
        report = of_job(job_dir, running=True)
    except Exception as exc:
        log.warning("the job's goodput could not be read from its ledger (%s: %s)", type(exc).__name__, exc)
        return {}
    return {"percent": round(report.goodput, 2), "wall_seconds": round(report.wall, 1),
            "buckets": {k: round(v, 2) for k, v in report.buckets.items()}, "attempts": report.job_attempts,
            "disruptions": report.disruption_count, "steps_lost": report.steps_lost, "line": report.line()}
