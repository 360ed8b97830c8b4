"""``python -m entrypoint local``: emulate a Vertex AI cluster on this machine with real processes.

Each replica gets the CLUSTER_SPEC, TF_CONFIG and AIP_* variables Vertex would set (pool0 chief,
pool1 workers, pool2 parameter servers, pool3 evaluators) on free 127.0.0.1 ports; its output is
prefixed with the replica name; the first failure stops the rest and sets the exit code; Ctrl-C
and SIGTERM reach every replica (each runs in its own process group, its children included).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from entrypoint import envvars as ev
from entrypoint.errors import ConfigError, ExitCode

GRACE_SECONDS = 15.0
POOL_ROLES = (("workerpool0", "chief"), ("workerpool1", "worker"), ("workerpool2", "ps"), ("workerpool3", "evaluator"))


@dataclass
class Replica:
    """One emulated replica: its pool, index, environment and (once started) process."""

    pool: str
    index: int
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    pump: threading.Thread | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        """The replica name used as log prefix, e.g. ``workerpool1-0``."""
        return f"{self.pool}-{self.index}"


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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
        replicas.append(Replica(pool, index, env))
    return replicas


def _pump(prefix: str, stream: IO[bytes], lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            sys.stdout.write(f"[{prefix}] {line}\n")
            sys.stdout.flush()


def _signal_group(replica: Replica, sig: int) -> None:
    if replica.proc is not None and replica.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(replica.proc.pid, sig)


def stop_all(replicas: Sequence[Replica], sig: int = signal.SIGTERM, grace: float = GRACE_SECONDS) -> None:
    """Send ``sig`` to every replica's process group; SIGKILL whatever is left after ``grace`` seconds."""
    for r in replicas:
        _signal_group(r, sig)
    deadline = time.monotonic() + grace
    for r in replicas:
        if r.proc is not None:
            try:
                r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(r, signal.SIGKILL)
                r.proc.wait()


def run_replicas(replicas: list[Replica], command: Sequence[str]) -> int:
    """Start every replica, wait; the first failure stops the others and gives the exit code."""
    lock = threading.Lock()
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for r in replicas:
            r.proc = subprocess.Popen(
                [sys.executable, "-m", "entrypoint", *command], env=r.env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
            assert r.proc.stdout is not None
            r.pump = threading.Thread(target=_pump, args=(r.name, r.proc.stdout, lock), daemon=True)
            r.pump.start()
        code = 0
        while True:
            if received:
                sig = received[0]
                print(f"[local] received {signal.Signals(sig).name}: stopping every replica", flush=True)
                stop_all(replicas, sig)
                code = 128 + sig
                break
            running = [r for r in replicas if r.proc is not None and r.proc.poll() is None]
            failed = [r for r in replicas if r.proc is not None and r.proc.returncode not in (None, 0)]
            if failed:
                first = failed[0]
                assert first.proc is not None
                rc = first.proc.returncode
                code = rc if rc > 0 else 128 - rc  # killed by a signal: 128 + signal number
                print(f"[local] {first.name} exited with {code}: stopping the other replicas", flush=True)
                stop_all(running)
                break
            if not running:
                break
            time.sleep(0.1)
        for r in replicas:
            if r.pump is not None:
                r.pump.join(timeout=5)
        return code
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


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
    if args.workers < 1 or args.ps < 0 or args.evaluators < 0:
        raise ConfigError("local", "--workers must be >= 1; --ps and --evaluators >= 0")
    if not command or command[0] not in ("run", "describe"):
        raise ConfigError("local", "the replica command after '--' must start with 'run' or 'describe'")
    return args, command


def main(argv: Sequence[str]) -> int:
    """Run the emulated cluster and return the job's exit code."""
    args, command = parse_args(argv)
    replicas = build_replicas(args, dict(os.environ))
    names = ", ".join(r.name for r in replicas)
    print(f"[local] starting {len(replicas)} replicas ({names}); outputs under {Path(args.output_dir).resolve()}",
          flush=True)
    code = run_replicas(replicas, command)
    chief = replicas[0].env
    metrics = sorted(Path(args.output_dir).resolve().glob(".replicas/*/hypertune/output.metrics"))
    print(f"[local] job finished with exit code {code}", flush=True)
    print(f"[local] model:       {chief[ev.AIP_MODEL_DIR]}\n[local] checkpoints: {chief[ev.AIP_CHECKPOINT_DIR]}\n"
          f"[local] tensorboard: {chief[ev.AIP_TENSORBOARD_LOG_DIR]}\n"
          f"[local] hypertune:    {', '.join(map(str, metrics)) or 'none reported'}", flush=True)
    return int(code) if code != 0 else ExitCode.OK
