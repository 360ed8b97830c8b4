"""``python -m entrypoint local``: emulate a Vertex AI cluster on this machine with real processes.

Each replica gets the CLUSTER_SPEC, TF_CONFIG and AIP_* variables Vertex would set (pool0 chief,
pool1 workers, pool2 parameter servers, pool3 evaluators) on free 127.0.0.1 ports; its output is
prefixed with the replica name; the first failure stops the rest and sets the exit code; Ctrl-C
and SIGTERM reach every replica (each runs in its own process group, its children included).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from entrypoint import envvars as ev
from entrypoint.errors import ConfigError, ExitCode
from entrypoint.supervisor import Replica, free_ports, run_replicas


def cluster_specs(workers: int, ps: int, evaluators: int, trial: str | None) -> list[tuple[str, int, dict[str, Any]]]:
    """CLUSTER_SPEC per replica, as Vertex writes it (pools absent when empty)."""
    sizes = {"workerpool0": 1, "workerpool1": workers - 1, "workerpool2": ps, "workerpool3": evaluators}
    ports = iter(free_ports(sum(sizes.values())))
    cluster = {pool: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for pool, n in sizes.items() if n > 0}
    out = []
    for pool, members in cluster.items():
        for index in range(len(members)):
            task: dict[str, Any] = {"type": pool, "index": index}
            if trial is not None:
                task["trial"] = trial
            spec = {"cluster": cluster, "environment": "cloud", "task": task, "job": {"emulated": True}}
            out.append((pool, index, spec))
    return out


def vertex_tf_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The TF_CONFIG Vertex sets beside CLUSTER_SPEC: chief / worker / ps, evaluator outside ``cluster``."""
    names = {"workerpool0": "chief", "workerpool1": "worker", "workerpool2": "ps", "workerpool3": "evaluator"}
    cluster = {names[p]: m for p, m in spec["cluster"].items() if p != "workerpool3"}
    task = {"type": names[spec["task"]["type"]], "index": spec["task"]["index"]}
    if "trial" in spec["task"]:
        task["trial"] = spec["task"]["trial"]
    return {"cluster": cluster, "task": task, "environment": "cloud", "job": spec["job"]}


def build_replicas(args: argparse.Namespace, base_env: dict[str, str]) -> list[Replica]:
    """Every replica's environment, exactly as Vertex would set it, plus a private scratch dir."""
    output = Path(args.output_dir).resolve()
    base = output / args.trial if args.trial else output
    replicas = []
    for pool, index, spec in cluster_specs(args.workers, args.ps, args.evaluators, args.trial):
        scratch = output / ".replicas" / f"{pool}-{index}"
        (scratch / "tmp").mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in base_env.items() if k not in (ev.CLUSTER_SPEC, ev.TF_CONFIG)}
        env.update({
            ev.CLUSTER_SPEC: json.dumps(spec),
            ev.TF_CONFIG: json.dumps(vertex_tf_config(spec)),
            ev.AIP_MODEL_DIR: f"{base}/model/",
            ev.AIP_CHECKPOINT_DIR: f"{base}/checkpoints/",
            ev.AIP_TENSORBOARD_LOG_DIR: f"{base}/logs/",
            # Each Vertex replica is its own machine: its /tmp (hypertune's file) is private.
            ev.CLOUD_ML_HP_METRIC_FILE: str(scratch / "hypertune" / "output.metrics"),
            "TMPDIR": str(scratch / "tmp"),
            ev.TRAINER_REPLICA: f"{pool}-{index}",
            "PYTHONUNBUFFERED": "1",
        })
        if args.trial:
            env[ev.CLOUD_ML_TRIAL_ID] = args.trial
        replicas.append(Replica(pool, index, env, [sys.executable, "-m", "entrypoint", *args.command]))
    return replicas


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """``local`` options before ``--``; the replica command (``run ...``) after it."""
    argv = list(argv)
    if "--" not in argv:
        raise ConfigError("local", "expected '-- run ...' after the local options")
    i = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m entrypoint local", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1, help="training replicas: 1 chief + N-1 workers")
    parser.add_argument("--ps", type=int, default=0, help="parameter servers (workerpool2)")
    parser.add_argument("--evaluators", type=int, default=0, help="evaluators (workerpool3)")
    parser.add_argument("--trial", help="emulate a hyperparameter-tuning trial with this id")
    parser.add_argument("--output-dir", default="./outputs", help="the job's base output directory")
    args = parser.parse_args(argv[:i])
    command = argv[i + 1:]
    args.command = command
    if args.workers < 1 or args.ps < 0 or args.evaluators < 0:
        raise ConfigError("local", "--workers must be >= 1; --ps and --evaluators >= 0")
    if not command or command[0] not in ("run", "describe"):
        raise ConfigError("local", "the replica command after '--' must start with 'run' or 'describe'")
    return args, command


def main(argv: Sequence[str]) -> int:
    """Run the emulated cluster and return the job's exit code."""
    args, _command = parse_args(argv)
    replicas = build_replicas(args, dict(os.environ))
    names = ", ".join(r.name for r in replicas)
    print(f"[local] starting {len(replicas)} replicas ({names}); outputs under {Path(args.output_dir).resolve()}",
          flush=True)
    code = run_replicas(replicas)
    chief = replicas[0].env
    metrics = sorted(Path(args.output_dir).resolve().glob(".replicas/*/hypertune/output.metrics"))
    print(f"[local] job finished with exit code {code}", flush=True)
    print(f"[local] model:       {chief[ev.AIP_MODEL_DIR]}\n[local] checkpoints: {chief[ev.AIP_CHECKPOINT_DIR]}\n"
          f"[local] tensorboard: {chief[ev.AIP_TENSORBOARD_LOG_DIR]}\n"
          f"[local] hypertune:    {', '.join(map(str, metrics)) or 'none reported'}", flush=True)
    return int(code) if code != 0 else ExitCode.OK
