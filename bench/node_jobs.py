"""A sharded or replicated job on 2 emulated nodes x 2 processes whose worker node is SIGKILLed while it trains.

What the ``recovery`` family's HSDP rows and the ``chaos`` family share: ``local --workers 2`` (``--restart-policy
vertex``, the platform restarting the lost node in place) running the GPT of ``tests/pytorch/sharded_hooks.py`` with
``--nproc-per-node 2``; the worker node's whole process tree (``workerpool1-0``) SIGKILLed at a step of the chief or
every N seconds. The log is read as it is written: each loss's stall is the time from the SIGKILL to the chief's next
progress line that is new training: any step of a restarted chief, or the second step after the last one logged
before the kill (the step in flight may still be logged by a survivor that had finished it as the kill came, so the
stall includes one step). The job dir's ledger gives the rest (``entrypoint goodput --json``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import REPO, clean_env, python
from bench.recovery import descendants, replica_group

CHIEF_STEP = re.compile(r"^\[workerpool0-0(#\d+)?\] .*epoch \d+/\d+ step (\d+)/(\d+)")
VICTIM = "workerpool1-0"
CHIEF = "workerpool0-0"


@dataclass
class NodeRun:
    """One job: its wall time, its losses as the log showed them, and its ledger's report."""

    seconds: float
    stalls: list[float] = field(default_factory=list)  # per loss: SIGKILL to the chief's next new step, seconds
    kills: int = 0
    chief_kept_pids: bool | None = None  # the chief's node never restarted (in place)
    goodput: dict[str, Any] = field(default_factory=dict)  # `entrypoint goodput --json` of the job dir

    @property
    def steps_lost(self) -> int:
        return int(self.goodput.get("steps", {}).get("lost", 0))


def new_training(pending: tuple[float, int, str], attempt: str, step: int) -> bool:
    """Whether the chief's progress line (its attempt suffix, its step) is training after the loss ``pending``
    (when, the chief's last step logged before it, its attempt then): a restarted chief's, two steps on (the step
    in flight at the kill may be logged by a survivor that had finished it), or a step at or before the one logged
    before the kill (the same process logs a step twice only after every rank rolled back to a peer snapshot)."""
    return attempt != pending[2] or step > pending[1] + 1 or step <= pending[1]


def end_tree(proc: subprocess.Popen[bytes]) -> None:
    """A job still running (a failed measurement) SIGKILLed with every process below it: nothing left running into
    the next measurement."""
    if proc.poll() is None:
        for pid in [*descendants(proc.pid), proc.pid]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def command(out: str, strategy: str, recovery: str, step_sleep: float, *, windows: int, epochs: int,
            checkpoint_every: int, max_restarts: int, snapshot_every: int | None = None) -> list[str]:
    """``local --workers 2`` running the sharded-hooks GPT on 2 processes per node (``snapshot_every``: FSDP's
    peer-memory snapshots between commits)."""
    return [*python(), "-m", "entrypoint", "local", "--workers", "2", "--restart-policy", "vertex",
            "--max-restarts", str(max_restarts), "--output-dir", out, "--",
            "run", "--framework", "pytorch", "--module", "tests.pytorch.sharded_hooks", "--timeout", "120",
            "--log-every", "1", "--nproc-per-node", "2", "--strategy", strategy, "--recovery", recovery,
            "--epochs", str(epochs), "--checkpoint-every", str(checkpoint_every),
            *([] if snapshot_every is None else ["--snapshot-every", str(snapshot_every)]), "--",
            "--step-sleep", str(step_sleep), "--windows", str(windows)]


def node_job(strategy: str, recovery: str, step_sleep: float, *, kill_at: int | None = None,
             kill_every: float | None = None, kill_wall: float | None = None, windows: int = 512, epochs: int = 2,
             checkpoint_every: int = 4, snapshot_every: int | None = None, max_restarts: int = 5,
             timeout: float = 1200) -> NodeRun:
    """Run one job; SIGKILL the worker node when the chief logs step ``kill_at``, or each time the job has trained
    ``kill_every`` seconds (from its first step, then from its first new step after the previous loss: a job whose
    recovery took longer than the interval would otherwise never reach a checkpoint), or at every multiple of
    ``kill_wall`` seconds of wall time from the job's start (the issue's schedule; one that comes while the last loss
    is not recovered yet is skipped: the node is not back), never in the last 5 steps (a loss during the export is
    another measurement)."""
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "log"
        cmd = command(f"{tmp}/out", strategy, recovery, step_sleep, windows=windows, epochs=epochs,
                      checkpoint_every=checkpoint_every, max_restarts=max_restarts, snapshot_every=snapshot_every)
        run = NodeRun(0.0)
        with log_path.open("wb") as sink, log_path.open("rb") as source:
            started = time.perf_counter()
            proc = subprocess.Popen(cmd, env=clean_env(), cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
            step = total = 0
            next_kill: float | None = None
            attempt = ""  # the chief's attempt suffix ("#1" once restarted)
            pending: tuple[float, int, str] | None = None  # a loss not yet followed by new training
            chief: int | None = None
            wall_next, wall_due = kill_wall or 0.0, False  # the next kill_wall multiple, and whether it is due now
            try:
                while proc.poll() is None:
                    now = time.perf_counter()
                    if now - started > timeout:
                        raise RuntimeError(f"{' '.join(cmd)} did not finish within {timeout:g} s")
                    for line in source.read().decode(errors="replace").splitlines():
                        if not (m := CHIEF_STEP.match(line)):
                            continue
                        attempt, step, total = m.group(1) or "", int(m.group(2)), int(m.group(3))
                        if pending is not None and new_training(pending, attempt, step):
                            run.stalls.append(now - pending[0])
                            pending = None
                            next_kill = None if kill_every is None else now + kill_every
                        if kill_every is not None and next_kill is None and run.kills == 0:
                            next_kill = now + kill_every
                    if kill_wall is not None and now - started >= wall_next:
                        wall_due, wall_next = pending is None, wall_next + kill_wall
                    due = (kill_at is not None and run.kills == 0 and step >= kill_at) or \
                        (next_kill is not None and now >= next_kill) or wall_due
                    wall_due = False
                    if due and pending is None and step < total - 5:
                        tree = descendants(proc.pid)
                        victim = replica_group(VICTIM, tree)
                        if victim is not None:
                            chief = chief if chief is not None else replica_group(CHIEF, tree)
                            os.killpg(victim, signal.SIGKILL)
                            run.kills += 1
                            pending = (now, step, attempt)
                            next_kill = None
                    time.sleep(0.05)
            finally:
                end_tree(proc)
            run.seconds = time.perf_counter() - started
        text = log_path.read_text(errors="replace")
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{text[-3000:]}")
        if kill_at is not None and run.kills == 0:
            raise RuntimeError(f"the job ended before step {kill_at}: nothing was killed")
        if chief is not None:
            run.chief_kept_pids = f"[{CHIEF}#1]" not in text
        report = subprocess.run([*python(), "-m", "entrypoint", "goodput", f"{tmp}/out", "--json"], env=clean_env(),
                                cwd=REPO, capture_output=True, text=True, check=True)
        run.goodput = json.loads(report.stdout)
    return run
