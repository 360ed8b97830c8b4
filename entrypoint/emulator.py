"""``python -m entrypoint local``: emulate a Vertex AI cluster on this machine with real processes.

Each replica gets the CLUSTER_SPEC, TF_CONFIG and AIP_* variables Vertex would set (pool0 chief,
pool1 workers, pool2 parameter servers, pool3 evaluators) on free 127.0.0.1 ports; its output is
prefixed with the replica name; the first failure stops the rest and sets the exit code; Ctrl-C
and SIGTERM reach every replica (each runs in its own process group, its children included).

The cluster is a list of ``Pool``s, so a job spec whose pools run different arguments (or a pool on
another image, listed in CLUSTER_SPEC but not started) is emulated the same way as ``--workers N``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entrypoint import envvars as ev
from entrypoint import failures
from entrypoint.environments.vertex import VERTEX_POOLS
from entrypoint.errors import ConfigError, ExitCode
from entrypoint.options import DEFAULT_GRACE_PERIOD
from entrypoint.supervisor import Replica, free_ports, run_replicas

COMMANDS = ("run", "describe")
GRACE_MARGIN = 5.0


@dataclass(frozen=True)
class Pool:
    """One Vertex worker pool: its name (``workerpool0``..``3``), replica count and entrypoint command.

    ``command`` is what follows ``python -m entrypoint`` (``run ...``). A pool with ``start=False``
    is listed in every CLUSTER_SPEC, as Vertex lists it, but no process is started for it (a
    Reduction Server runs Google's image, not ours); ``note`` says why. ``env`` is the pool's own
    container environment (a job spec's ``containerSpec.env``), beneath the variables Vertex sets.
    """

    name: str
    replicas: int
    command: tuple[str, ...] = ()
    start: bool = True
    note: str = ""
    env: tuple[tuple[str, str], ...] = ()


def vertex_pools(workers: int, ps: int, evaluators: int, command: Sequence[str]) -> list[Pool]:
    """``--workers N --ps P --evaluators E``: the chief, N-1 workers, P servers, E evaluators, one command."""
    sizes = zip(VERTEX_POOLS, (1, workers - 1, ps, evaluators), strict=True)
    return [Pool(name, count, tuple(command)) for name, count in sizes if count > 0]


def cluster_specs(pools: Sequence[Pool], trial: str | None) -> list[tuple[Pool, int, dict[str, Any]]]:
    """CLUSTER_SPEC per replica, as Vertex writes it (pools absent when empty), every pool on a free port."""
    ports = iter(free_ports(sum(p.replicas for p in pools)))
    cluster = {p.name: [f"127.0.0.1:{next(ports)}" for _ in range(p.replicas)] for p in pools if p.replicas > 0}
    out = []
    for pool in pools:
        for index in range(pool.replicas):
            task: dict[str, Any] = {"type": pool.name, "index": index}
            if trial is not None:
                task["trial"] = trial
            spec = {"cluster": cluster, "environment": "cloud", "task": task, "job": {"emulated": True}}
            out.append((pool, index, spec))
    return out


def vertex_tf_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The TF_CONFIG Vertex sets beside CLUSTER_SPEC: chief / worker / ps, evaluator outside ``cluster``."""
    cluster = {VERTEX_POOLS[p]: m for p, m in spec["cluster"].items() if VERTEX_POOLS[p] != "evaluator"}
    task = {"type": VERTEX_POOLS[spec["task"]["type"]], "index": spec["task"]["index"]}
    if "trial" in spec["task"]:
        task["trial"] = spec["task"]["trial"]
    return {"cluster": cluster, "task": task, "environment": "cloud", "job": spec["job"]}


def build_replicas(pools: Sequence[Pool], output_dir: str, trial: str | None,
                   base_env: dict[str, str]) -> list[Replica]:
    """Every started replica's environment, exactly as Vertex would set it, plus a private scratch dir."""
    output = Path(output_dir).resolve()
    base = output / trial if trial else output
    replicas = []
    for pool, index, spec in cluster_specs(pools, trial):
        if not pool.start:
            continue
        scratch = output / ".replicas" / f"{pool.name}-{index}"
        (scratch / "tmp").mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in base_env.items() if k not in (ev.CLUSTER_SPEC, ev.TF_CONFIG)}
        env.update(pool.env)
        env.update({
            ev.CLUSTER_SPEC: json.dumps(spec),
            ev.TF_CONFIG: json.dumps(vertex_tf_config(spec)),
            ev.AIP_MODEL_DIR: f"{base}/model/",
            ev.AIP_CHECKPOINT_DIR: f"{base}/checkpoints/",
            ev.AIP_TENSORBOARD_LOG_DIR: f"{base}/logs/",
            # Each Vertex replica is its own machine: its /tmp (hypertune's file) is private.
            ev.CLOUD_ML_HP_METRIC_FILE: str(scratch / "hypertune" / "output.metrics"),
            "TMPDIR": str(scratch / "tmp"),
            ev.TRAINER_REPLICA: f"{pool.name}-{index}",
            "PYTHONUNBUFFERED": "1",
        })
        if trial:
            env[ev.CLOUD_ML_TRIAL_ID] = trial
        replicas.append(Replica(pool.name, index, env, [sys.executable, "-m", "entrypoint", *pool.command]))
    return replicas


def replica_grace(pools: Sequence[Pool]) -> float:
    """How long ``local`` waits for stopping replicas: their own ``--grace-period`` plus a margin.

    A replica forwards the signal to its own processes and kills them after its grace period; the
    emulator waits a little longer, so it never kills a replica that is still saving on time.
    """
    from entrypoint.cli import parse_options

    graces = [parse_options("run", p.command[1:]).grace_period for p in pools if p.start and p.command[:1] == ("run",)]
    return max(graces, default=DEFAULT_GRACE_PERIOD) + GRACE_MARGIN


def run_cluster(pools: Sequence[Pool], output_dir: str, trial: str | None = None) -> int:
    """Start every pool's replicas, wait for the job, and say where its outputs went."""
    for pool in pools:
        if pool.start and (not pool.command or pool.command[0] not in COMMANDS):
            raise ConfigError("local", f"{pool.name}: the replica command must start with 'run' or 'describe'")
        if not pool.start:
            print(f"[local] {pool.name}: {pool.replicas} replica(s) listed in CLUSTER_SPEC, not started: {pool.note}",
                  flush=True)
    replicas = build_replicas(pools, output_dir, trial, dict(os.environ))
    output = Path(output_dir).resolve()
    job_dir = output / trial if trial else output
    ctx = failures.Context(replica="local", job_dir=str(job_dir), started=time.time())
    names = ", ".join(r.name for r in replicas)
    print(f"[local] starting {len(replicas)} replicas ({names}); outputs under {output}", flush=True)
    code, first = run_replicas(replicas, grace=replica_grace(pools))
    chief = replicas[0].env
    metrics = sorted(output.glob(".replicas/*/hypertune/output.metrics"))
    print(f"[local] job finished with exit code {code}", flush=True)
    print(f"[local] model:       {chief[ev.AIP_MODEL_DIR]}\n[local] checkpoints: {chief[ev.AIP_CHECKPOINT_DIR]}\n"
          f"[local] tensorboard: {chief[ev.AIP_TENSORBOARD_LOG_DIR]}\n"
          f"[local] hypertune:    {', '.join(map(str, metrics)) or 'none reported'}", flush=True)
    if code == ExitCode.OK:
        return ExitCode.OK
    return failures.conclude_exit(ctx, code, who=first.name if first else None)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """``local`` options before ``--``; the replica command (``run ...``) after it, as ``args.command``."""
    argv = list(argv)
    i = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m entrypoint local", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1, help="training replicas: 1 chief + N-1 workers")
    parser.add_argument("--ps", type=int, default=0, help="parameter servers (workerpool2)")
    parser.add_argument("--evaluators", type=int, default=0, help="evaluators (workerpool3)")
    parser.add_argument("--trial", help="emulate a hyperparameter-tuning trial with this id")
    parser.add_argument("--output-dir", default="./outputs", help="the job's base output directory")
    parser.add_argument("--spec", metavar="FILE", help="run a Vertex CustomJob / CustomJobSpec / gcloud --config "
                        "file (JSON or YAML) instead of --workers/--ps/--evaluators and '-- run ...'")
    args = parser.parse_args(argv[:i])
    args.command = argv[i + 1:]
    if args.spec is not None:
        if "--" in argv or any(a.split("=", 1)[0] in ("--workers", "--ps", "--evaluators") for a in argv[:i]):
            raise ConfigError("local", "--spec takes the pools and their args from the file: drop --workers, "
                              "--ps, --evaluators and '-- run ...'")
        return args
    if "--" not in argv:
        raise ConfigError("local", "expected '-- run ...' after the local options (or --spec FILE)")
    if args.workers < 1 or args.ps < 0 or args.evaluators < 0:
        raise ConfigError("local", "--workers must be >= 1; --ps and --evaluators >= 0")
    if not args.command or args.command[0] not in COMMANDS:
        raise ConfigError("local", "the replica command after '--' must start with 'run' or 'describe'")
    return args


def main(argv: Sequence[str]) -> int:
    """Run the emulated cluster and return the job's exit code (the root cause's, when it fails)."""
    args = parse_args(argv)
    if args.spec is not None:
        from entrypoint.jobs.specfile import spec_pools

        job = spec_pools(args.spec)
        return run_cluster(job.pools, args.output_dir, args.trial or job.trial)
    return run_cluster(vertex_pools(args.workers, args.ps, args.evaluators, args.command), args.output_dir, args.trial)
