"""Hooks-loop throughput: the entrypoint's own loop vs a hand-written nanoGPT-style loop, same model, data, optimizer.

Both train ``bench.gpt`` (AdamW, gradient clipping at 1.0, random windows of the synthetic corpus) and
time the same window of steps. World 1: ``python bench/ddp_loop.py`` (no process group, as the
entrypoint runs one process) vs ``entrypoint run --module bench.gpt_hooks``. World 2: ``torchrun
--nproc-per-node 2 bench/ddp_loop.py`` (DDP) vs ``entrypoint run --nproc-per-node 2`` (DDP), with
OMP_NUM_THREADS split between the processes on both sides. Target: at least 0.98 of the hand loop.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    FamilyResult,
    Row,
    check,
    clean_env,
    compare,
    devices_for,
    free_port,
    interleave,
    python,
    timed,
)

LOOP = str(REPO / "bench" / "ddp_loop.py")


@dataclass(frozen=True)
class Size:
    """One run's shape."""

    config: str
    steps: int
    warmup: int
    batch: int


def thread_env(world: int) -> dict[str, str]:
    """The cores split between the ``world`` processes (as torchrun does), on CPU if there are too few GPUs."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"OMP_NUM_THREADS": str(max(1, cores // world)), **devices_for(world)}


def hand_loop(world: int, size: Size, flags: tuple[str, ...] = (), ddp: bool = False,
              timeout: float = 900) -> dict[str, Any]:
    """The hand-written loop's result: bare for world 1 (DDP with ``ddp``), torchrun for world > 1."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        args = [LOOP, "--config", size.config, "--steps", str(size.steps), "--warmup", str(size.warmup),
                "--batch-size", str(size.batch), "--result", str(result), *flags]
        env = thread_env(world)
        if world > 1:
            cmd = [*python(), "-m", "torch.distributed.run", "--nproc-per-node", str(world),
                   "--master-port", str(free_port()), *args]
        else:
            cmd = [*python(), *args]
            if ddp:
                env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(free_port()))
        timed([(cmd, clean_env(env))], timeout)
        found: dict[str, Any] = json.loads(result.read_text())
        return found


def hooks_loop(world: int, size: Size, flags: tuple[str, ...] = (), user_flags: tuple[str, ...] = (),
               timeout: float = 900) -> dict[str, Any]:
    """The entrypoint's loop over ``bench.gpt_hooks``: what its export hook wrote, and the strategy it ran."""
    with tempfile.TemporaryDirectory() as job:
        cmd = [*python(), "-m", "entrypoint", "run", "--framework", "pytorch", "--module", "bench.gpt_hooks",
               "--nproc-per-node", str(world), "--job-dir", job, "--batch-size", str(size.batch),
               "--log-every", "1000000", "--clip-grad-norm", "1.0", *flags, "--",
               "--config", size.config, "--steps", str(size.steps), "--warmup", str(size.warmup),
               "--batch", str(size.batch), *user_flags]
        timed([(cmd, clean_env(thread_env(world)))], timeout)
        found: dict[str, Any] = json.loads((Path(job) / "model" / "bench_timing.json").read_text())
        summary = json.loads((Path(job) / "model" / "training_summary.json").read_text())
        found.update(strategy=summary["strategy"], strategy_reason=summary["details"].get("strategy_reason", ""),
                     compile_seconds=summary["details"].get("compile_seconds", 0.0))
        return found


def tokens_per_second(result: dict[str, Any]) -> float:
    """The throughput a loop reported."""
    return float(result["tokens_per_second"])


def measure(world: int, size: Size, repeats: int) -> list[Row]:
    """Hand loop (anchor) vs hooks loop at one world size."""
    variants = {
        "hand-written loop" + (" (torchrun, DDP)" if world > 1 else ""):
            lambda: tokens_per_second(hand_loop(world, size)),
        "entrypoint hooks loop" + (" (DDP)" if world > 1 else ""):
            lambda: tokens_per_second(hooks_loop(world, size)),
    }
    results = interleave(variants, repeats)
    rows = compare(f"world {world}", results, "tokens/s", next(iter(variants)), "x hand loop")
    check(rows[1], ">=", 0.98)
    return rows


def digits_step_seconds(epochs: int | None = None) -> float:
    """The digits demo's step time (``trainers.digits_torch``, one process), as its own job ledger measured it:
    the steps' seconds over their count, the first step of the attempt left out (imports, first batches).
    ``epochs``: fewer than the demo's own 15 (the quick size: one epoch is 45 steps, plenty for a mean)."""
    with tempfile.TemporaryDirectory() as job:
        cmd = [*python(), "-m", "entrypoint", "run", "--framework", "pytorch", "--module", "trainers.digits_torch",
               "--job-dir", job, "--log-every", "1000000", *(["--epochs", str(epochs)] if epochs else [])]
        timed([(cmd, clean_env(thread_env(1)))])
        records = [json.loads(line) for path in (Path(job) / "ledger").glob("*.jsonl")
                   for line in path.read_text().splitlines() if '"progress"' in line]
    seconds = sum(r["step_seconds"] - r.get("first_step_seconds", 0.0) for r in records)
    steps = sum(r["steps"] - (1 if "first_step_seconds" in r else 0) for r in records)
    return seconds / max(steps, 1)


def recorder_step_seconds(steps: int) -> float:
    """What the job ledger costs a step: the chief's ``step_begin`` + ``step_end`` with its records really written
    (a segment every ``FLUSH_EVERY`` s, to a local job dir), per step."""
    import time

    from entrypoint.lifecycle.recorder import Recorder
    from entrypoint.outputs.goodput.ledger import Ledger

    with tempfile.TemporaryDirectory() as job:
        record = Recorder(Ledger(job, "bench@host:1:0", "workerpool0-0", 0))
        record.enter("preparation")
        started = time.perf_counter()
        for step in range(1, steps + 1):
            record.step_begin()
            record.step_end(step)
        elapsed = time.perf_counter() - started
        record.close("finished")
    return elapsed / steps


def ledger_rows(repeats: int, steps: int, epochs: int | None) -> list[Row]:
    """The job ledger's cost per ``steps`` steps against the digits demo's step time (its first ``epochs``, or all),
    measured in the same run."""
    results = interleave({"digits demo step (anchor)": lambda: digits_step_seconds(epochs),
                          "job ledger per step": lambda: recorder_step_seconds(steps)}, repeats)
    rows = compare("job ledger", {k: [v * 1e6 for v in vs] for k, vs in results.items()}, "us",
                   "digits demo step (anchor)", "x digits step")
    check(rows[1], "<=", 0.01)
    return rows


def run(quick: bool) -> FamilyResult:
    """World 1 (and 2 in the full size)."""
    size = Size("tiny", 30, 5, 8) if quick else Size("cpu", 120, 10, 8)
    worlds, repeats = ((1,), 1) if quick else ((1, 2), 3)
    result = FamilyResult("loop", "Hooks-loop throughput vs a hand-written loop (tokens/s, higher is better)")
    for world in worlds:
        result.rows += measure(world, size, repeats)
    steps, epochs = (2000, 1) if quick else (20000, None)  # quick: the ledger's cost the same, the demo 45 steps
    result.rows += ledger_rows(repeats, steps, epochs)
    result.notes.append(f"bench.gpt config '{size.config}', batch {size.batch} per process, {size.steps} steps, "
                        f"timed from step {size.warmup} to the last; {repeats} interleaved repetitions")
    result.notes.append("job ledger: the chief's per-step recording (two clock reads, counters, a progress record "
                        f"every 10 s written to a local job dir) over {steps} steps, against one step of "
                        "`entrypoint run --module trainers.digits_torch` as its own ledger timed it"
                        f"{f' ({epochs} epoch)' if epochs else ''}")
    result.notes.append("world 1: the entrypoint trains in its own process without a process group, so the "
                        "hand loop runs without DDP too; DDP buckets: torch's 25 MB (hand) vs our 64 MB")
    return result
