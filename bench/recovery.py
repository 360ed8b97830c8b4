"""Recovery: the seconds a lost worker costs, restart-the-world vs survivors-keep-training, side by side.

The same PyTorch hooks job (the digits model of ``tests/pytorch/faults.py``, ``local --workers 3``,
``--restart-policy vertex``) runs three ways: uninterrupted; with one worker's process tree SIGKILLed
at a given step under ``--recovery restart`` (every replica exits, is restarted in place, and resumes
from the newest checkpoint); and the same under ``--recovery in-place`` (the survivors keep their
processes, the replacement joins and is healed from rank 0). Lost seconds = the job's wall time minus
the uninterrupted median. The log is read as it is written, so the bench also times the replacement's
own start-up (from local's restart line to its "joining a job in progress" line) and checks that the
survivors kept their PIDs.

Target (in-place): lost seconds <= the replacement's start-up + 2 s + one step.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import REPO, FamilyResult, Row, clean_env, median, python

STEP_LINE = re.compile(r"^\[workerpool0-0\] .* step (\d+)/")
VICTIM = "workerpool1-1"
SURVIVORS = ("workerpool0-0", "workerpool1-0")


@dataclass
class Run:
    """One job: its wall time, and what the log showed as it happened."""

    seconds: float
    startup: float | None = None  # the replacement's start-up (in-place), seconds
    kept_pids: bool | None = None
    recoveries: list[dict[str, object]] = field(default_factory=list)


def replica_group(name: str, pids: list[int]) -> int | None:
    """The session leader of an emulated replica's current attempt (``TRAINER_REPLICA`` in its environment)."""
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"TRAINER_REPLICA={name}".encode() in environ and os.getpgid(pid) == pid:
                return pid
        except OSError:
            continue
    return None


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (by /proc's parent links)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [root]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def job(recovery: str, kill_at: int | None, step_sleep: float) -> Run:
    """One ``local --workers 3`` job; SIGKILL the victim's process group when the chief logs ``kill_at``."""
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "log"
        cmd = [*python(), "-m", "entrypoint", "local", "--workers", "3", "--output-dir", f"{tmp}/out", "--",
               "run", "--framework", "pytorch", "--module", "tests.pytorch.faults", "--log-every", "1",
               "--checkpoint-every", "10", "--timeout", "120", "--recovery", recovery, "--",
               "--step-sleep", str(step_sleep)]
        with log_path.open("wb") as sink:
            started = time.perf_counter()
            proc = subprocess.Popen(cmd, env=clean_env(), cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
            run = Run(0.0)
            survivors: dict[str, int | None] = {}
            killed = restarted = None
            with log_path.open("rb") as source:
                while proc.poll() is None:
                    chunk = source.read()
                    now = time.perf_counter()
                    for line in chunk.decode(errors="replace").splitlines():
                        if kill_at is not None and killed is None and (m := STEP_LINE.match(line)) and \
                                int(m.group(1)) >= kill_at:
                            tree = descendants(proc.pid)
                            survivors = {name: replica_group(name, tree) for name in SURVIVORS}
                            victim = replica_group(VICTIM, tree)
                            if victim is not None:
                                os.killpg(victim, signal.SIGKILL)
                                killed = now
                        if restarted is None and line.startswith(f"[local] {VICTIM} exited"):
                            restarted = now
                        if run.startup is None and restarted is not None and "joining a job in progress as rank" in \
                                line:
                            run.startup = now - restarted
                    time.sleep(0.02)
            run.seconds = time.perf_counter() - started
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            if kill_at is not None and killed is None:
                raise RuntimeError(f"the job ended before step {kill_at}: nothing was killed")
            if survivors:  # found when the victim was killed, and never restarted since (no "#1" attempt)
                text = log_path.read_text(errors="replace")
                run.kept_pids = all(pid is not None and f"[{name}#1]" not in text for name, pid in survivors.items())
        summary = Path(tmp) / "out" / "model" / "training_summary.json"
        if summary.exists():
            run.recoveries = json.loads(summary.read_text()).get("recoveries", [])
    return run


def run(quick: bool) -> FamilyResult:
    """Uninterrupted, restart-the-world and in-place, interleaved; lost seconds against the uninterrupted median."""
    repeats, step_sleep, kill_at = (1, 0.05, 6) if quick else (3, 0.1, 10)
    variants = {"uninterrupted": ("in-place", None), "restart the world": ("restart", kill_at),
                "survivors keep training": ("in-place", kill_at)}
    runs: dict[str, list[Run]] = {name: [] for name in variants}
    for round_ in range(repeats):
        names = list(variants)
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            recovery, at = variants[name]
            runs[name].append(job(recovery, at, step_sleep))
    base = median([r.seconds for r in runs["uninterrupted"]])
    result = FamilyResult("recovery", "Recovery: seconds lost per worker loss (lower is better)")
    result.rows.append(Row("world 3 (wall time)", "uninterrupted", "s", [round(r.seconds, 3) for r in
                                                                        runs["uninterrupted"]], round(base, 3)))
    restart_lost = median([r.seconds - base for r in runs["restart the world"]])
    for name in ("restart the world", "survivors keep training"):
        lost = [round(r.seconds - base, 3) for r in runs[name]]
        row = Row("lost per worker loss", name, "s", lost, round(median(lost), 3),
                  ratio=round(median(lost) / restart_lost, 3) if restart_lost > 0 else None,
                  ratio_label="x restart the world")
        if name == "survivors keep training":
            startups = [r.startup for r in runs[name] if r.startup is not None]
            limit = (median(startups) if startups else 0.0) + 2.0 + step_sleep
            row.target = f"<= start-up {median(startups):.2f} s + 2 s + 1 step" if startups else "start-up not seen"
            row.met = bool(startups) and row.median <= limit and all(r.kept_pids for r in runs[name])
            stalled = [float(str(rec.get("stalled_seconds", 0))) for r in runs[name] for rec in r.recoveries]
            row.note = (f"replacement start-up {median(startups):.2f} s; survivors kept their PIDs: "
                        f"{all(r.kept_pids for r in runs[name])}; training stalled {median(stalled):.2f} s"
                        if startups and stalled else "")
        result.rows.append(row)
    result.notes.append(f"local --workers 3, --restart-policy vertex, tests/pytorch/faults.py (digits MLP), "
                        f"{step_sleep} s per step, checkpoint every 10 steps, SIGKILL of {VICTIM}'s process group "
                        f"at step {kill_at}; {repeats} interleaved repetition(s)")
    hsdp_rows(result, quick)
    if not quick:  # the 110M GPT over 2 nodes: minutes a job on CPU
        from bench import peer_heal

        heal_rows, note = peer_heal.rows()
        result.rows += heal_rows
        result.notes.append(note)
    return result


def hsdp_rows(result: FamilyResult, quick: bool) -> None:
    """HSDP on 2 nodes x 2 processes: uninterrupted, restart-the-world and in place, the worker node SIGKILLed."""
    from bench.node_jobs import NodeRun, node_job

    repeats, step_sleep, kill_at = (1, 0.1, 6) if quick else (2, 0.2, 9)
    variants = {"uninterrupted": ("in-place", None), "restart the world": ("restart", kill_at),
                "survivors keep training": ("in-place", kill_at)}
    runs: dict[str, list[NodeRun]] = {name: [] for name in variants}
    for round_ in range(repeats):
        shift = round_ % len(variants)
        for name in [*variants][shift:] + [*variants][:shift]:
            recovery, at = variants[name]
            runs[name].append(node_job("hsdp", recovery, step_sleep, kill_at=at))
    base = median([r.seconds for r in runs["uninterrupted"]])
    group = "HSDP 2x2"
    result.rows.append(Row(f"{group} (wall time)", "uninterrupted", "s",
                           [round(r.seconds, 3) for r in runs["uninterrupted"]], round(base, 3)))
    restart_lost = median([r.seconds - base for r in runs["restart the world"]])
    for name in ("restart the world", "survivors keep training"):
        lost = [round(r.seconds - base, 3) for r in runs[name]]
        stalls = [s for r in runs[name] for s in r.stalls]
        steps = [r.steps_lost for r in runs[name]]
        row = Row(f"{group} lost per node loss", name, "s", lost, round(median(lost), 3),
                  ratio=round(median(lost) / restart_lost, 3) if restart_lost > 0 else None,
                  ratio_label="x restart the world",
                  note=f"steps lost {steps}; stalled (loss to the chief's second new step) "
                       f"{[round(s, 2) for s in stalls]} s")
        if name == "survivors keep training":
            kept = all(r.chief_kept_pids for r in runs[name])
            row.target = "0 steps lost, chief's node kept its processes"
            row.met = kept and not any(steps)
            row.note += f"; chief's node kept its processes: {kept}"
        result.rows.append(row)
        result.rows.append(Row(f"{group} stall per node loss", name, "s", [round(s, 3) for s in stalls],
                               round(median(stalls), 3)))
    result.notes.append(f"HSDP: local --workers 2 --nproc-per-node 2 --strategy hsdp, tests/pytorch/sharded_hooks.py "
                        f"(GPT, 32 steps), {step_sleep} s per step, checkpoint every 4 steps, SIGKILL of "
                        f"workerpool1-0's process group at the chief's step {kill_at}; steps lost from `entrypoint "
                        f"goodput --json`; {repeats} interleaved repetition(s)")
