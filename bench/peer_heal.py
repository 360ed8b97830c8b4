"""FSDP's heal from peer memory against the restart from storage, on the 110M GPT with its checkpoints on gs://.

Issue 54's proof: the same job, ``bench.gpt_hooks`` (config ``100m``, 110M parameters, AdamW) under ``local --workers
2 --nproc-per-node 1 --restart-policy vertex --strategy fsdp`` (2 nodes x 1 process: four 110M processes do not fit
the 2 shared cores of the machine this was written on), a commit every ``EVERY`` steps to ``gs://`` on the suite's
GCS emulator (``bench/gcs_reads.py``, which counts every object it serves), the worker node's process tree SIGKILLed
two steps after the first checkpoint is committed (and, healing, its peer snapshot exchanged), before the next save
starts (a node lost while a sharded checkpoint is written is another case: docs/benchmarks.md), run two ways:
``--recovery in-place`` (the defaults: the survivors keep their processes, every rank rolls back to the newest snapshot
and the replacement takes its shards from its peer's memory) and ``--recovery restart`` (every process exits and the
job resumes from the newest sharded checkpoint on gs://). Measured from the log as it is written: the time from the
SIGKILL to the chief's first step of new training (bench/node_jobs.py's ``new_training``), and the checkpoint objects
the emulator served in that window. Target: the heal at most 0.5x the restart, with no checkpoint object read.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import REPO, Row, clean_env, free_port, median, python, wait_for_port
from bench.gcs_reads import READS, count_reads
from bench.node_jobs import CHIEF, CHIEF_STEP, VICTIM, end_tree, new_training
from bench.recovery import descendants, replica_group

EVERY = 8  # --checkpoint-every: a commit (and a peer snapshot) every 8 steps; the kill between two commits
STEPS = 20
BUCKET = "bench"
VARIANTS = {"restart from storage": "restart", "heal from peer memory": "in-place"}
HEALED = re.compile(r"\[workerpool0-0\] .*(group re-formed with .* in [\d.]+ s, nothing read from storage)")
RESUMED = re.compile(r"\[workerpool0-0#\d+\] .*(resumed from \S+ckpt-\d+)")


@dataclass
class Heal:
    """One job's loss: from the SIGKILL to the chief's first new step, and what was read from gs:// meanwhile."""

    stall: float = 0.0
    checkpoint_reads: list[str] = field(default_factory=list)  # the objects' names
    all_reads: int = 0
    killed_at: int = 0
    said: str = ""  # the chief's line about the heal or the resume
    steps_lost: int = 0
    seconds: float = 0.0


@contextlib.contextmanager
def emulator(data_dir: Path, reads: Path) -> Iterator[str]:
    """The counting emulator on a free port for the block; its ``STORAGE_EMULATOR_HOST``."""
    port = free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir.parent / "emulator.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "bench.gcs_reads", "start", "--host", "127.0.0.1", "--port",
                                 str(port), "--default-bucket", BUCKET, "--quiet"], cwd=REPO, stdout=out, stderr=out,
                                env=clean_env({"STORAGE_BASE": str(data_dir), READS: str(reads)}),
                                start_new_session=True)
    try:
        wait_for_port(port, proc, f"the GCS emulator ({log})")
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def command(out: str, recovery: str, config: str, step_sleep: float = 0.0) -> list[str]:
    """The 2-node FSDP job, its checkpoints on the emulator's bucket."""
    return [*python(), "-m", "entrypoint", "local", "--workers", "2", "--restart-policy", "vertex", "--max-restarts",
            "5", "--output-dir", out, "--", "run", "--framework", "pytorch", "--module", "bench.gpt_hooks",
            "--nproc-per-node", "1", "--strategy", "fsdp", "--batch-size", "1", "--checkpoint-every", str(EVERY),
            "--log-every", "1", "--timeout", "600", "--recovery", recovery, "--checkpoint-dir",
            f"gs://{BUCKET}/{recovery}/checkpoints", "--", "--config", config, "--steps", str(STEPS), "--warmup", "1",
            "--batch", "1", *(["--step-sleep", str(step_sleep)] if step_sleep else [])]


def ready(text: str, recovery: str) -> bool:
    """The first checkpoint committed (and, healing, the first peer snapshot exchanged): there is something to lose
    and something to recover from either way."""
    committed = f"ckpt-{EVERY:08d} committed" in text
    return committed and (recovery != "in-place" or f"peer snapshot of step {EVERY}: " in text)


def one_job(recovery: str, config: str, step_sleep: float = 0.0, timeout: float = 1800) -> Heal:
    """The job; the SIGKILL once ``ready`` and the chief is a step past the commit; its loss measured."""
    heal = Heal()
    with tempfile.TemporaryDirectory() as tmp:
        reads, log_path = Path(tmp) / "reads.txt", Path(tmp) / "log"
        with emulator(Path(tmp) / "gcs", reads) as host:
            env = clean_env({"STORAGE_EMULATOR_HOST": host, "CUDA_VISIBLE_DEVICES": "", "TMPDIR": tmp})
            cmd = command(f"{tmp}/out", recovery, config, step_sleep)
            started = time.monotonic()
            with log_path.open("wb") as sink, log_path.open("rb") as source:
                proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
                text, step, attempt = "", 0, ""
                pending: tuple[float, int, str] | None = None
                killed = found = None
                committed_at: int | None = None  # the chief's step when ``ready`` first held
                try:
                    while proc.poll() is None:
                        if time.monotonic() - started > timeout:
                            raise RuntimeError(f"{' '.join(cmd)} did not finish within {timeout:g} s")
                        chunk = source.read().decode(errors="replace")
                        text += chunk
                        for line in chunk.splitlines():
                            if (m := CHIEF_STEP.match(line)) is None:
                                continue
                            attempt, step = m.group(1) or "", int(m.group(2))
                            if pending is not None and found is None and new_training(pending, attempt, step):
                                found = time.time()
                        if committed_at is None and ready(text, recovery):
                            committed_at = step
                        # two steps on: the chief's one-time check of its first save's marker against the grace
                        # period (pytorch/recovery/notices.py, a read of COMMITTED) is done before the loss
                        if killed is None and committed_at is not None and step >= 2 * EVERY - 1:
                            raise RuntimeError(f"checkpoint {EVERY} was committed at step {committed_at}: too late "
                                               "to lose a node before the next save")
                        if killed is None and committed_at is not None and step >= committed_at + 2:
                            victim = replica_group(VICTIM, descendants(proc.pid))
                            if victim is not None:
                                os.killpg(victim, signal.SIGKILL)
                                killed = time.time()
                                pending, heal.killed_at = (killed, step, attempt), step
                        time.sleep(0.05)
                finally:
                    end_tree(proc)
            heal.seconds = time.monotonic() - started
            text = log_path.read_text(errors="replace")
            if proc.returncode != 0 or killed is None or found is None:
                lines = [line for line in text.splitlines() if re.search(r"WARNING|ERROR|\[local\]", line)]
                raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode} (killed: {killed is not None}, a step "
                                   f"after: {found is not None}):\n" + "\n".join(lines[-40:]) + f"\n…\n{text[-3000:]}")
            heal.stall = found - killed
            heal.checkpoint_reads = count_reads(reads, killed, found, under="checkpoints/")
            heal.all_reads = len(count_reads(reads, killed, found))
            said = HEALED.search(text) or RESUMED.search(text)
            heal.said = said.group(1) if said else ""
            report = subprocess.run([*python(), "-m", "entrypoint", "goodput", f"{tmp}/out", "--json"], env=env,
                                    cwd=REPO, capture_output=True, text=True, check=True)
            heal.steps_lost = int(json.loads(report.stdout).get("steps", {}).get("lost", 0))
            if f"[{CHIEF}#1]" in text and recovery == "in-place":
                raise RuntimeError(f"the chief's node restarted while healing in place:\n{text[-3000:]}")
    return heal


def kinds(names: list[str]) -> str:
    """How many of each file of a checkpoint were read (``{'COMMITTED': 3, '__0_0.distcp': 1}``), or nothing."""
    return f"{dict(sorted(Counter(n.rsplit('/', 1)[-1] for n in names).items()))} " if names else ""


def rows(config: str = "100m", repeats: int = 1, step_sleep: float = 0.0) -> tuple[list[Row], str]:
    """Restart (the anchor) and heal, interleaved; the heal's row checked against 0.5x and no checkpoint read."""
    runs: dict[str, list[Heal]] = {name: [] for name in VARIANTS}
    for round_ in range(repeats):
        names = [*VARIANTS][round_ % 2:] + [*VARIANTS][:round_ % 2]
        for name in names:
            runs[name].append(one_job(VARIANTS[name], config, step_sleep))
    restart = median([h.stall for h in runs["restart from storage"]])
    group = f"FSDP {config} 2x1, checkpoints on gs://: loss to the first new step"
    found = []
    for name, heals in runs.items():
        stall = median([h.stall for h in heals])
        note = "; ".join(f"killed at step {h.killed_at}, {h.steps_lost} step(s) lost, {len(h.checkpoint_reads)} "
                         f"checkpoint object(s) read from gs:// in the window {kinds(h.checkpoint_reads)}"
                         f"({h.all_reads} objects in all), wall {h.seconds:.0f} s: {h.said}" for h in heals)
        row = Row(group, name, "s", [round(h.stall, 2) for h in heals], round(stall, 2),
                  ratio=round(stall / restart, 3) if restart > 0 else None, ratio_label="x restart", note=note)
        if name == "heal from peer memory":
            row.target = "<= 0.5x restart, 0 checkpoint reads"
            row.met = row.ratio is not None and row.ratio <= 0.5 and not any(h.checkpoint_reads for h in heals)
        found.append(row)
    note = (f"FSDP heal vs restart: local --workers 2 --nproc-per-node 1 --restart-policy vertex -- run --module "
            f"bench.gpt_hooks --strategy fsdp --checkpoint-every {EVERY} --checkpoint-dir gs://... (the suite's GCS "
            f"emulator, counting what it serves), config '{config}', {STEPS} steps of batch 1, workerpool1-0's "
            f"process group SIGKILLed two steps after checkpoint {EVERY} was committed (healing: and its peer "
            f"snapshot exchanged), before the next save: --recovery in-place vs restart; {repeats} interleaved run(s) "
            "each")
    return found, note


if __name__ == "__main__":  # python -m bench.peer_heal [config [repeats [step sleep]]]: the rows alone, as JSON
    given = sys.argv[1:]
    got, said = rows(given[0] if given else "100m", int(given[1]) if len(given) > 1 else 1,
                     float(given[2]) if len(given) > 2 else 0.0)
    print(json.dumps({"rows": [r.__dict__ for r in got], "note": said}, indent=1))
