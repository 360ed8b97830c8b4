"""Stops: a SIGTERM at a random moment of each phase of the PyTorch hooks loop, the platform's SIGKILL at the grace
period; what each stop committed, how long it took, and whether the resumed job ends with the uninterrupted weights.

The digits model of ``tests/pytorch/faults.py`` runs on three topologies: one process (``run``), a node of two
processes (``run --nproc-per-node 2``) and two emulated replicas (``local --workers 2``). Each chain stops one job
once per phase, one phase after the other, each in a fresh attempt on the same job dir: the start-up
(``build_model``), a wait for a batch (a slow read on every rank; with two processes, also on rank 1 alone while
rank 0 waits inside the next step), a checkpoint write in flight, the evaluation, the restore, the export; then the
job runs to its end. A stop is sent at a uniformly random moment of its phase (the phase's own line on stdout
starts the clock); the job must end 143 within ``--grace-period`` (else it is SIGKILLed, as the platform would), with
its newest committed checkpoint at the newest step it trained (the next attempt logs ``(0 steps`` lost), and the
end of the chain must have the weights of the same job never stopped.

Target: every stop commits the newest trained step, within the grace period; every chain ends bit-exact.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import REPO, FamilyResult, Row, clean_env, median, python

GRACE = 10.0  # --grace-period, and when the platform's SIGKILL follows the SIGTERM
PROGRESS = re.compile(r"epoch \d+/\d+ step (\d+)/\d+")
MARKER = "COMMITTED"  # a checkpoint's commit marker (outputs/checkpoints.py)
TOPOLOGIES = ("one process", "node of 2 processes", "local --workers 2")


@dataclass(frozen=True)
class Phase:
    """A slow phase of the faults module: its options (``{at}``: a step of the attempt), the line that starts it,
    and how long it lasts (the stop comes uniformly within that)."""

    name: str
    options: tuple[str, ...]
    line: str
    seconds: float


PHASES = (
    Phase("start-up", ("--build-sleep", "8"), "build_model: sleeping", 7.0),
    Phase("loader wait", ("--slow-read-at", "{at}", "--read-block", "30"), "slow read", 6.0),
    Phase("checkpoint in flight", ("--save-sleep", "1", "--step-sleep", "0.02"), "checkpoint write: sleeping", 1.0),
    Phase("evaluation", ("--eval-sleep", "2"), "evaluating slowly", 3.0),  # 12 s or more: longer than the grace
    Phase("restore", ("--restore-sleep", "8"), "restore: sleeping", 7.0),
    Phase("export", ("--export-delay", "8"), "exporting in", 7.0),
)
# Two processes: rank 1 waits for its batch while rank 0 is already inside the next step's collectives.
ONE_RANK_WAITS = Phase("loader wait, rank 1 only",
                       ("--slow-read-at", "{at}", "--read-block", "30", "--fault-rank", "1"), "slow read", 6.0)


def phases(topology: str) -> tuple[Phase, ...]:
    """The phases a chain stops in on ``topology`` (two processes: also one rank waiting alone)."""
    return PHASES if topology == "one process" else (*PHASES[:2], ONE_RANK_WAITS, *PHASES[2:])


@dataclass
class Stop:
    """One stopped attempt: where and when the stop came, how the job ended, what it trained and committed."""

    topology: str
    phase: str
    delay: float
    code: int = 0
    seconds: float = 0.0  # from the SIGTERM to the job's last line (its failure line, saying what it committed)
    exited: float = 0.0  # from the SIGTERM to the job's end (the interpreter's own exit included)
    killed: bool = False  # the platform's SIGKILL at the grace period ended it
    trained: int = 0  # the newest step a progress line showed
    committed: int = -1  # the newest committed checkpoint's step (-1: none)
    lost: int | None = None  # what the next attempt said was lost
    last_line: str = ""
    lines: list[str] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        """Stopped on its own, 143, within the grace period, nothing trained lost."""
        kept = self.committed >= self.trained or self.trained == 0  # nothing trained: nothing to commit
        said = bool(self.last_line) and self.seconds < GRACE  # its last line came before the platform's kill
        return said and self.code in (143, 137 if self.killed else 143) and kept and self.lost in (0, None)


@dataclass
class Watched:
    """A job in the background, its output lines collected as they come."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # when each line came (``time.monotonic``)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.times.append(time.monotonic())
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = 300) -> bool:
        """Whether a line containing ``text`` came before the job ended (or ``timeout``)."""
        deadline, seen = time.monotonic() + timeout, 0
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines[seen:]):
                return True
            seen = max(len(self.lines) - 1, 0)
            if self.proc.poll() is not None:
                time.sleep(0.2)
                return any(text in line for line in self.lines)
            time.sleep(0.02)
        return False

    def trained(self) -> int:
        """The newest step any progress line showed."""
        return max((int(m.group(1)) for line in self.lines if (m := PROGRESS.search(line))), default=0)


def command(topology: str, out: Path, extra: list[str], flags: tuple[str, ...] = ()) -> list[str]:
    """The job on ``topology`` writing under ``out``, with ``run``'s ``flags`` and the faults module's ``extra``
    options."""
    run = ["--framework", "pytorch", "--module", "tests.pytorch.faults", "--log-every", "1", "--timeout", "120",
           "--grace-period", f"{GRACE:g}", "--checkpoint-every", "8", *flags]
    if topology == "local --workers 2":
        return [*python(), "-m", "entrypoint", "local", "--workers", "2", "--output-dir", str(out), "--restart-policy",
                "never", "--", "run", *run, "--", *extra]
    nproc = ["--nproc-per-node", "2"] if topology == "node of 2 processes" else []
    return [*python(), "-m", "entrypoint", "run", *run, *nproc, "--job-dir", str(out), "--", *extra]


def start(topology: str, out: Path, extra: list[str], flags: tuple[str, ...] = ()) -> Watched:
    """The job, in a session of its own (the platform's SIGKILL takes its whole tree)."""
    proc = subprocess.Popen(command(topology, out, extra, flags), cwd=REPO, env=clean_env({"TRAINER_CPUS": "1"}),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return Watched(proc)


def newest_committed(out: Path) -> int:
    """The newest committed checkpoint's step under ``out`` (-1: none)."""
    found = [int(p.parent.name[5:]) for p in (out / "checkpoints").glob(f"ckpt-*/{MARKER}")]
    return max(found, default=-1)


def stop_in(topology: str, phase: Phase, out: Path, rng: random.Random, at: int = 5,
            flags: tuple[str, ...] = ()) -> Stop:
    """One attempt on ``out`` (``run``'s ``flags``) stopped at a random moment of ``phase``; what it committed."""
    extra = [o.replace("{at}", str(at)) for o in phase.options]
    job = start(topology, out, extra, flags)
    stop = Stop(topology, phase.name, round(rng.uniform(0.0, phase.seconds), 2))
    try:
        if not job.wait_for(phase.line):
            raise RuntimeError(f"{phase.name}: the phase never started:\n" + "\n".join(job.lines[-40:]))
        time.sleep(stop.delay)
        sent = time.monotonic()
        os.kill(job.proc.pid, signal.SIGTERM)
        try:
            job.proc.wait(timeout=GRACE)
        except subprocess.TimeoutExpired:
            os.killpg(job.proc.pid, signal.SIGKILL)  # the platform's kill at the end of the grace period
            stop.killed = True
            job.proc.wait()
        stop.exited = round(time.monotonic() - sent, 2)
    finally:
        if job.proc.poll() is None:
            os.killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait()
    time.sleep(0.3)  # the reader's last lines
    stop.code = 128 - job.proc.returncode if job.proc.returncode < 0 else job.proc.returncode
    stop.trained, stop.committed = job.trained(), newest_committed(out)
    said = [(t, line) for t, line in zip(job.times, job.lines, strict=False) if "entrypoint: error:" in line]
    stop.last_line = said[-1][1] if said else ""
    stop.seconds = round(said[0][0] - sent, 2) if said else 0.0
    stop.lines = job.lines
    return stop


LOST = re.compile(r"resumed after .* at step \d+.*: resumed from step \d+ \((\d+) steps")


def lost(lines: list[str]) -> int | None:
    """What an attempt said the stop before it lost (None: no line, it resumed where nothing had been trained)."""
    found = [int(m.group(1)) for line in lines if (m := LOST.search(line))]
    return found[0] if found else None


def chain(topology: str, rng: random.Random, root: Path, say: Callable[[str], None],
          only: tuple[Phase, ...] | None = None, flags: tuple[str, ...] = ()) -> tuple[list[Stop], str]:
    """Stops of one job, one per phase (``only``: these; ``flags``: ``run``'s), then its end: the stops and the final
    weights' digest."""
    out = root / topology.replace(" ", "-")
    stops: list[Stop] = []
    for phase in only or phases(topology):
        stop = stop_in(topology, phase, out, rng, at=rng.randint(3, 15), flags=flags)
        if stops:  # this attempt resumed after the previous stop: its line says what that one lost
            stops[-1].lost = lost(stop.lines)
        stops.append(stop)
        killed = " (the platform's SIGKILL)" if stop.killed else ""
        say(f"{topology}: {phase.name} at +{stop.delay:.2f} s: last line in {stop.seconds:.1f} s, exit {stop.code} in "
            f"{stop.exited:.1f} s{killed}, trained {stop.trained}, committed {stop.committed}")
    job = start(topology, out, [], flags)
    code = job.proc.wait(timeout=600)
    time.sleep(0.3)
    if code != 0:
        raise RuntimeError(f"{topology}: the last attempt exited {code}:\n" + "\n".join(job.lines[-40:]))
    stops[-1].lost = lost(job.lines)
    return stops, str(json.loads((out / "model" / "training_summary.json").read_text())["param_digests"][0])


def reference(topology: str, root: Path) -> str:
    """The same job never stopped: its final weights' digest."""
    out = root / f"{topology.replace(' ', '-')}-uninterrupted"
    job = start(topology, out, [])
    if job.proc.wait(timeout=600) != 0:
        time.sleep(0.3)
        raise RuntimeError(f"{topology}: the uninterrupted job failed:\n" + "\n".join(job.lines[-40:]))
    return str(json.loads((out / "model" / "training_summary.json").read_text())["param_digests"][0])


def run(quick: bool) -> FamilyResult:
    """Chains of stops on every topology (quick: one chain, one process); the rows per phase."""
    rounds, topologies = (1, TOPOLOGIES[:1]) if quick else (3, TOPOLOGIES)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    title = "Stops: a SIGTERM in every phase of the hooks loop (s from it to the job's last line, lower is better)"
    result = FamilyResult("stops", title)
    stops: list[Stop] = []
    exact: list[bool] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for topology in topologies:
            expected = reference(topology, root)
            for number in range(rounds):
                chained, digest = chain(topology, rng, root / f"round{number}", lambda line: print(line, flush=True))
                stops += chained
                exact.append(digest == expected)
    for topology in topologies:
        for phase in phases(topology):
            mine = [s for s in stops if (s.topology, s.phase) == (topology, phase.name)]
            row = Row(topology, phase.name, "s", [s.seconds for s in mine], round(median([s.seconds for s in mine]), 2),
                      target=f"last line < {GRACE:g} s, 143, 0 steps lost", met=all(s.ok for s in mine))
            row.note = "; ".join(f"+{s.delay:.1f} s: trained {s.trained}, committed {s.committed}, ended in "
                                 f"{s.exited:.1f} s" for s in mine)
            result.rows.append(row)
    bad = [s for s in stops if not s.ok]
    result.notes.append(f"{len(stops)} stops (seed {seed}), {len(stops) - len(bad)} committed the newest trained "
                        f"step within the {GRACE:g} s grace period and lost none; {sum(exact)} of {len(exact)} chains "
                        "ended with the uninterrupted job's weights")
    result.notes += [f"NOT COMMITTED: {s.topology}, {s.phase}: {s.last_line}" for s in bad]
    return result
