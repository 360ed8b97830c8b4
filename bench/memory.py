"""Peak memory of the processes on a node that do not train: launchers, agents, supervisors.

Each job is started and its process tree sampled from /proc every 50 ms; every process's peak resident
set (``VmHWM``) is kept. Training processes name themselves (the scripts touch ``$BENCH_PID_DIR/<pid>``);
everything else in the tree counts, and the row reports the sum of those peaks (MiB), with each process in
the note. Compared: our in-process run (nothing besides the trainer), ``torchrun``'s agent, our elastic agent
(``--nproc-per-node 2``), the ``local`` supervisor, and the Horovod launchers (ours vs ``horovodrun``).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from bench.common import REPO, FamilyResult, clean_env, compare, devices_for, free_port, interleave, python

DDP_SCRIPT, HVD_SCRIPT = str(REPO / "bench" / "ddp_script.py"), str(REPO / "bench" / "hvd_script.py")


@dataclass
class Tree:
    """Per-process peak RSS (MiB) and name of a process tree, sampled while it runs."""

    root: int
    peaks: dict[int, float] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)

    def sample(self) -> None:
        """One pass over /proc: find the root's descendants, keep each one's VmHWM."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry.name))
        todo = [self.root]
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            self._read(pid)

    def _read(self, pid: int) -> None:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                self.peaks[pid] = max(self.peaks.get(pid, 0.0), int(line.split()[1]) / 1024)
                self.names.setdefault(pid, short_name(cmdline))


def short_name(cmdline: str) -> str:
    """What a process is, in a few words (``python -m entrypoint local``, ``torchrun``, ...)."""
    words = [w for w in cmdline.split() if not w.startswith("/") or w.endswith(".py")]
    for marker in ("entrypoint.worker", "torch.distributed.run", "horovodrun", "entrypoint", "multiprocessing"):
        for i, w in enumerate(words):
            if marker in w:
                return " ".join(words[i:i + 2])
    return " ".join(Path(w).name for w in cmdline.split()[:3])


def peak_non_training(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Run ``cmd``; the summed peak RSS of its non-training processes (MiB) and who they were."""
    with tempfile.TemporaryDirectory() as pids, tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, env={**env, "BENCH_PID_DIR": pids}, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        tree = Tree(proc.pid)
        while proc.poll() is None:
            tree.sample()
            time.sleep(0.05)
        if proc.returncode != 0:
            log.seek(0)
            tail = log.read()[-3000:].decode(errors="replace")
            raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{tail}")
        training = {int(p.name) for p in Path(pids).iterdir()}
    others = {pid: mib for pid, mib in tree.peaks.items() if pid not in training}
    who = ", ".join(f"{tree.names[pid]} {mib:.0f}" for pid, mib in sorted(others.items()))
    return sum(others.values()), who or "none"


Command = Callable[[Path], list[str]]  # the job's command, given an output directory


def jobs(steps: int, horovod: bool, quick: bool) -> dict[str, tuple[str, dict[str, Command]]]:
    """Every launcher to measure, by group: group -> (its anchor, {name: command}); ``quick`` skips 1 process."""
    ddp, after = ["--framework", "pytorch", "--script", DDP_SCRIPT], ["--", "--steps", str(steps)]
    run = [*python(), "-m", "entrypoint", "run"]
    tr = [*python(), "-m", "torch.distributed.run", "--standalone"]
    found: dict[str, tuple[str, dict[str, Command]]] = {}
    if not quick:
        found["1 process"] = ("torchrun --nproc-per-node 1", {
            "entrypoint run (1 process, in-process)": lambda d: [*run, *ddp, "--job-dir", str(d), *after],
            "torchrun --nproc-per-node 1": lambda d: [*tr, "--nproc-per-node", "1", DDP_SCRIPT, *after[1:]]})
    found["2 processes, 1 node"] = ("torchrun --nproc-per-node 2", {
        "entrypoint run --nproc-per-node 2": lambda d: [*run, *ddp, "--nproc-per-node", "2", "--job-dir", str(d),
                                                        *after],
        "torchrun --nproc-per-node 2": lambda d: [*tr, "--nproc-per-node", "2", DDP_SCRIPT, *after[1:]],
        "local --workers 2 (supervisor)": lambda d: [*python(), "-m", "entrypoint", "local", "--workers", "2",
                                                     "--output-dir", str(d), "--", "run", *ddp, *after]})
    horovodrun = shutil.which("horovodrun", path=str(Path(python()[0]).parent))
    if horovod and horovodrun:
        hvd = ["--framework", "horovod", "--script", HVD_SCRIPT]
        found["Horovod, 2 processes"] = ("horovodrun -np 2 --gloo", {
            "entrypoint run --framework horovod --nproc-per-node 2": lambda d: [
                *run, *hvd, "--nproc-per-node", "2", "--job-dir", str(d), *after],
            "horovodrun -np 2 --gloo": lambda d: [
                horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", "--gloo-timeout-seconds", "120",
                "-p", str(free_port()), *python(), HVD_SCRIPT, *after[1:]]})
    return found


def run(quick: bool) -> FamilyResult:
    """Every launcher, interleaved; ``quick``: one round of a short job, without the 1-process group."""
    steps, repeats = (20, 1) if quick else (400, 2)
    horovod = importlib.util.find_spec("horovod") is not None
    groups = jobs(steps, horovod, quick)
    commands = {name: cmd for _, members in groups.values() for name, cmd in members.items()}
    who: dict[str, str] = {}

    def measure(name: str) -> float:
        with tempfile.TemporaryDirectory() as out:
            mib, who[name] = peak_non_training(commands[name](Path(out)), clean_env(devices_for(2)))
            return mib

    results = interleave({name: partial(measure, name) for name in commands}, repeats)
    result = FamilyResult("memory", "Peak memory of the non-training processes per node (MiB, lower is better)")
    for group, (anchor, members) in groups.items():
        rows = compare(group, {n: results[n] for n in members}, "MiB", anchor, "x " + anchor.split(" -")[0])
        for row in rows:
            row.note = who[row.variant]
        result.rows += rows
    if not horovod:
        result.notes.append("Horovod is not installed in this venv: the Horovod launchers need .venv/horovod")
    result.notes.append(f"VmHWM of every process in the job's tree that is not a training process, summed "
                        f"(MiB; each process in the note, from the last run); {steps} DDP steps; {repeats} "
                        "interleaved round(s); /proc sampled every 50 ms")
    return result
