"""Launch overhead: the entrypoint vs the bare script vs torchrun, for one process and for two nodes.

The same small torchrun-style DDP script (``bench/ddp_script.py``) is started each way and the wall time
of the whole job is measured, from the first process started to the last one finished:

- world 1: ``python S`` with RANK/WORLD_SIZE/MASTER_* set (bare), ``python -m entrypoint run --script S``,
  ``torchrun --nproc-per-node 1 S``. Target: the entrypoint at most 1.05x the bare script.
- world 2: two bare processes, ``python -m entrypoint local --workers 2 -- run --script S``, two hand-started
  ``torchrun --nnodes 2 --node-rank i`` nodes. Target: ``local`` faster than the two torchrun nodes.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from functools import partial

from bench.common import REPO, FamilyResult, Row, check, clean_env, compare, free_port, interleave, python, timed

SCRIPT = str(REPO / "bench" / "ddp_script.py")


def bare(world: int, steps: int) -> float:
    """``world`` plain processes with torchrun's variables set by hand."""
    port = str(free_port())
    commands = [([*python(), SCRIPT, "--steps", str(steps)],
                 clean_env({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})) for r in range(world)]
    return timed(commands)


def entrypoint(world: int, steps: int) -> float:
    """``entrypoint run --script`` for one process; ``entrypoint local --workers 2`` for two nodes."""
    with tempfile.TemporaryDirectory() as out:
        run = ["run", "--framework", "pytorch", "--script", SCRIPT]
        if world == 1:
            cmd = [*python(), "-m", "entrypoint", *run, "--job-dir", out, "--", "--steps", str(steps)]
        else:
            cmd = [*python(), "-m", "entrypoint", "local", "--workers", str(world), "--output-dir", out, "--",
                   *run, "--", "--steps", str(steps)]
        return timed([(cmd, clean_env())])


def torchrun(world: int, steps: int) -> float:
    """``torchrun`` with one process per node, one node per process of the job (static rendezvous)."""
    port = str(free_port())
    commands = [([*python(), "-m", "torch.distributed.run", "--nnodes", str(world), "--node-rank", str(r),
                  "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port,
                  SCRIPT, "--steps", str(steps)], clean_env()) for r in range(world)]
    return timed(commands)


def measure(world: int, steps: int, repeats: int, warmup: int) -> list[Row]:
    """One group: the three launchers, interleaved; ratios vs the bare script."""
    names = ("bare script", "entrypoint run", "torchrun") if world == 1 else \
        ("2 bare processes", "local --workers 2", "2 torchrun nodes")
    fns: list[Callable[[int, int], float]] = [bare, entrypoint, torchrun]
    variants = {name: partial(fn, world, steps) for name, fn in zip(names, fns, strict=True)}
    results = interleave(variants, repeats, warmup)
    rows = compare(f"world {world}", results, "s", names[0], "x bare")
    if world == 1:
        check(rows[1], "<=", 1.05)
    else:
        local, two_torchruns = rows[1].median, rows[2].median
        check(rows[1], "<", 1.0, against=local / two_torchruns if two_torchruns else None, label="vs torchrun x2 ")
        rows[1].note = f"{local / two_torchruns:.3f}x the two torchrun nodes" if two_torchruns else ""
    return rows


def run(quick: bool) -> FamilyResult:
    """Both worlds; ``quick``: world 2 only (it starts each launcher: bare processes, ``local``, torchrun nodes),
    one repetition of a 2-step script."""
    steps, repeats, warmup = (2, 1, 0) if quick else (20, 5, 1)
    result = FamilyResult("launch", "Launch overhead (wall time of the whole job, lower is better)")
    for world in (2,) if quick else (1, 2):
        result.rows += measure(world, steps, repeats, warmup)
    result.notes.append(f"bench/ddp_script.py: gloo, {steps} DDP steps of a 19k-parameter MLP; "
                        f"{repeats} interleaved repetitions after {warmup} warm-up round(s)")
    return result
