"""Chaos: goodput of one job whose worker node is SIGKILLed again and again, DDP vs HSDP in place vs FSDP restart.

The same job (the GPT of ``tests/pytorch/sharded_hooks.py``, ``local --workers 2 --nproc-per-node 2``, a checkpoint
every 50 steps) runs once per strategy with the worker node's whole process tree SIGKILLed after every 30 s of
training (from the chief's first step, then from its first new step after the previous loss), and restarted by
``local --restart-policy vertex`` as the platform restarts a lost VM (``bench/node_jobs.py``). Counting the interval
from the recovery, not the wall clock, keeps a job whose recovery is slower than the interval from losing every
step since its last checkpoint forever; none comes in the last 5 steps. Reported from the job dir's ledger
(``entrypoint goodput --json``): goodput, steps lost, the disruptions, and the stall of each loss.

Targets (issue 54): FSDP and HSDP at 80% goodput or more, DDP not below 87.8% (its figure there: 1000 steps, a kill
every 40 s, 2 nodes x 2 processes).
"""

from __future__ import annotations

from bench.common import FamilyResult, Row, median
from bench.node_jobs import NodeRun, node_job

# strategy, --recovery, target (goodput % at least)
VARIANTS = {"DDP (in place)": ("ddp", "in-place", 87.8), "HSDP (in place)": ("hsdp", "in-place", 80.0),
            "FSDP (restart from storage)": ("fsdp", "restart", 80.0)}


def row_of(name: str, run: NodeRun, target: float, group: str) -> Row:
    """One strategy's goodput row, with what the ledger and the log said of its losses."""
    report = run.goodput
    percent = float(report.get("goodput_percent", 0.0))
    buckets = {k: round(v, 1) for k, v in report.get("buckets", {}).items() if k != "productive" and v >= 0.5}
    stalls = [round(s, 1) for s in run.stalls]
    note = (f"{run.kills} kill(s), {report.get('disruption_count')} disruption(s) in the ledger, "
            f"{run.steps_lost} step(s) lost, wall {run.seconds:.0f} s; stall per loss {stalls} s "
            f"(median {median(run.stalls):.1f}); badput {buckets}")
    return Row(group, name, "% goodput", [round(percent, 2)], round(percent, 2), target=f">= {target:g}%",
               met=percent >= target, note=note)


def run(quick: bool) -> FamilyResult:
    """Each strategy once, one after another, the same kill schedule."""
    step_sleep, windows, kill_every, checkpoint_every = (0.1, 1024, 10.0, 10) if quick else (0.2, 4800, 30.0, 50)
    epochs = 2
    steps = epochs * windows // 32  # 8 windows per rank's batch, 4 ranks
    group = f"{steps} steps, a kill per {kill_every:g} s trained"
    result = FamilyResult("chaos", "Chaos: goodput with the worker node SIGKILLed again and again (higher is better)")
    for name, (strategy, recovery, target) in VARIANTS.items():
        job = node_job(strategy, recovery, step_sleep, kill_every=kill_every, windows=windows, epochs=epochs,
                       checkpoint_every=checkpoint_every, max_restarts=1000)
        result.rows.append(row_of(name, job, target, group))
    result.notes.append(f"local --workers 2 --nproc-per-node 2 --restart-policy vertex, tests/pytorch/sharded_hooks.py "
                        f"(GPT, {steps} steps over {epochs} epochs), {step_sleep} s per step, checkpoint every "
                        f"{checkpoint_every} steps, workerpool1-0's process group SIGKILLed after every "
                        f"{kill_every:g} s of training (counted from the first step, then from the first new step "
                        f"after a loss); one run per strategy")
    return result
