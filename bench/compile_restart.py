"""A restart with ``--compile``: the restarted attempt's start-up through its first step against the first attempt's.

The GPT hooks module (``trainers/gpt_torch.py``) runs under ``local --workers 2 --recovery restart --compile``.
Once the chief has written the job's compile cache (its log says so after its first step), the worker's process
group is SIGKILLed: under ``--recovery restart`` the chief exits too, ``local`` restarts both replicas, each on a
fresh disk (a fresh temp dir, so a fresh Inductor cache), and both load the compile cache from the job dir before
their first step. The job ledger measures both attempts of the chief the same way: from its node's start to the
end of its first training step (``goodput --json``: ``attempts[].startup_seconds``). Full size adds a control:
the same job with the worker killed before the cache is written (at the chief's "training ..." line), so its
restart compiles everything again.

Target: the restarted attempt's start-up <= 0.5x the first attempt's, in the same job.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO, FamilyResult, Row, check, clean_env, median, python
from bench.recovery import descendants, replica_group

CHIEF, VICTIM = "workerpool0-0", "workerpool1-0"
WRITTEN = re.compile(rf"^\[{CHIEF}\] .*compile cache written to ")
TRAINING = re.compile(rf"^\[{CHIEF}\] .*INFO training \d+ epochs")
LOADED = re.compile(r"^\[(workerpool\d-\d)#1\] .*compile cache loaded from ")


@dataclass
class Job:
    """The chief's two attempts' start-ups (seconds; the first is None when it was killed before its first step),
    and the replicas whose restart loaded the compile cache."""

    first: float | None
    restart: float
    loaded: list[str]


def job(model_args: list[str], kill_after: re.Pattern[str]) -> Job:
    """One job; SIGKILL the worker once the chief's log matches ``kill_after``; the chief's attempts' start-ups."""
    with tempfile.TemporaryDirectory() as tmp:
        out, log_path = Path(tmp) / "out", Path(tmp) / "log"
        cmd = [*python(), "-m", "entrypoint", "local", "--workers", "2", "--output-dir", str(out), "--", "run",
               "--framework", "pytorch", "--module", "trainers.gpt_torch", "--compile", "--recovery", "restart",
               "--log-every", "1", "--checkpoint-every", "4", "--timeout", "300", "--", *model_args]
        killed = False
        with log_path.open("wb") as sink, log_path.open("rb") as source:
            proc = subprocess.Popen(cmd, env=clean_env(), cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
            while proc.poll() is None:
                for line in source.read().decode(errors="replace").splitlines():
                    if not killed and kill_after.match(line):
                        victim = replica_group(VICTIM, descendants(proc.pid))
                        if victim is not None:
                            os.killpg(victim, signal.SIGKILL)
                            killed = True
                time.sleep(0.05)
        text = log_path.read_text(errors="replace")
        if proc.returncode != 0 or not killed:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode} (worker killed: {killed}):\n{text[-3000:]}")
        report = subprocess.run([*python(), "-m", "entrypoint", "goodput", str(out), "--json"], env=clean_env(),
                                cwd=REPO, capture_output=True, text=True, check=True)
        chief = [a for a in json.loads(report.stdout)["attempts"] if a["chief"]]
    if len(chief) != 2 or chief[1]["startup_seconds"] is None:
        raise RuntimeError(f"expected two chief attempts, the second with a first step, in the ledger: {chief}")
    loaded = sorted({m.group(1) for m in map(LOADED.match, text.splitlines()) if m})
    return Job(chief[0]["startup_seconds"], float(chief[1]["startup_seconds"]), loaded)


def run(quick: bool) -> FamilyResult:
    """The first attempt and its restart, side by side in each job's ledger; at full size, the control too."""
    model = ["--windows", "4096", *(["--layers", "1", "--width", "32"] if quick else [])]
    repeats = 1 if quick else 2
    jobs = [job(model, WRITTEN) for _ in range(repeats)]
    controls = [] if quick else [job(model, TRAINING) for _ in range(repeats)]
    result = FamilyResult("restart", "Restart with --compile: start-up through the first step (lower is better)")
    first = [j.first or 0.0 for j in jobs]
    group = "chief, from the ledger"
    result.rows.append(Row(group, "first attempt (compiles)", "s", [round(v, 2) for v in first],
                           round(median(first), 2)))
    restart = [j.restart for j in jobs]
    row = Row(group, "restart, compile cache loaded", "s", [round(v, 2) for v in restart], round(median(restart), 2),
              ratio=round(median([j.restart / j.first for j in jobs if j.first]), 3),
              ratio_label="x the same job's first attempt",
              note=f"loaded by {', '.join(sorted({n for j in jobs for n in j.loaded})) or 'nobody'}")
    check(row, "<=", 0.5)
    row.met = row.met and all(j.loaded == [CHIEF, VICTIM] for j in jobs)  # every restarted replica loaded it
    result.rows.append(row)
    if controls:
        again = [j.restart for j in controls]
        result.rows.append(Row(group, "restart, killed before the cache was written", "s",
                               [round(v, 2) for v in again], round(median(again), 2),
                               ratio=round(median(again) / median(first), 3), ratio_label="x the first attempts"))
    result.notes.append(f"local --workers 2 --recovery restart --compile, trainers/gpt_torch.py {' '.join(model)}, "
                        f"checkpoint every 4 steps; {VICTIM}'s process group SIGKILLed once the chief wrote the "
                        f"compile cache{' (control: at its training line, before its first step)' if controls else ''}"
                        f"; {repeats} job(s) each; start-up = the chief attempt's start to the end of its first step, "
                        "as the job ledger records it")
    return result
