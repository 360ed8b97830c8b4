"""``python -m entrypoint local``: emulate a Vertex AI cluster on this machine with real processes.

Each replica gets the CLUSTER_SPEC, TF_CONFIG and AIP_* variables Vertex would set (pool0 chief,
pool1 workers, pool2 parameter servers, pool3 evaluators) on free 127.0.0.1 ports, and its own disk
(a working directory and a temp dir, fresh at every start); its output is prefixed with the replica
name (and its attempt once restarted); a failed replica is handled as the emulated platform would
(``lifecycle/supervision/restart_policy.py``: Vertex restarts it in place by default); Ctrl-C and SIGTERM reach every
replica (each runs in its own process group, its children included).

The cluster is a list of ``Pool``s, so a job spec whose pools run different arguments (or a pool on
another image, listed in CLUSTER_SPEC but not started) is emulated the same way as ``--workers N``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from entrypoint import failures
from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments._parse import get_trial
from entrypoint.cluster.environments.settings import host_cpus, secret_values, secrets_in_args
from entrypoint.errors import ConfigError, ExitCode, is_retryable
from entrypoint.failures.records import FAILURES_DIR, FALLBACK_DIR, current, read_records, record_names
from entrypoint.jobs.replicaenv import Pool, cluster_specs, vertex_pools, vertex_tf_config
from entrypoint.lifecycle import signals
from entrypoint.lifecycle.jobdir import jobrecord, lease
from entrypoint.lifecycle.recorder import PlatformRecorder
from entrypoint.lifecycle.runner import REFUSED
from entrypoint.lifecycle.supervision.restart_policy import (
    DEFAULT_BACKOFF_LIMIT,
    POLICIES,
    VERTEX_JOB_RETRIES,
    VERTEX_RESTARTS_PER_REPLICA,
    RestartPolicy,
)
from entrypoint.lifecycle.supervision.supervisor import Outcome, Replica, Supervisor
from entrypoint.options import DEFAULT_GRACE_PERIOD
from entrypoint.outputs import goodput, storage
from entrypoint.planning.runargs import Parser, parse_options, split_user_args

COMMANDS = ("run", "describe")
GRACE_MARGIN = 5.0
METRICS_DIR = ".replicas"
DISKS_PREFIX = "trainer-local-"  # under the temp dir: a local's replicas' own disks
OWNER = "owner.json"  # in a disks root: which local made it


def _output_base(output_dir: str) -> str:
    """The job's base output directory: an absolute local path, or a ``gs://`` (fsspec) URL as given."""
    if storage.is_remote(output_dir):
        return output_dir.rstrip("/")
    return str(Path(output_dir).resolve())


def _metrics_root(output_dir: str) -> Path:
    """Where replicas' tuning metric files go: the output dir, or the temp dir when outputs go to a store."""
    if storage.is_remote(output_dir):
        return Path(tempfile.gettempdir()) / f"trainer-local-{os.getppid()}-{os.getpid()}"
    return Path(output_dir).resolve()


def replica_cpus(env: Mapping[str, str], replicas: int) -> int:
    """Each replica's CPUs: the host's divided among the replicas, at least 1, as each would have its own VM's."""
    return max(1, host_cpus(env) // max(1, replicas))


def build_replicas(pools: Sequence[Pool], output_dir: str, trial: str | None,
                   base_env: dict[str, str]) -> list[Replica]:
    """Every started replica's environment, exactly as Vertex would set it."""
    output, metrics_root = _output_base(output_dir), _metrics_root(output_dir)
    base = f"{output}/{trial}" if trial else output
    replicas = []
    started = [(pool, index, spec) for pool, index, spec in cluster_specs(pools, trial) if pool.start]
    share = replica_cpus(base_env, len(started))
    for pool, index, spec in started:
        name = f"{pool.name}-{index}"
        env = {k: v for k, v in base_env.items() if k not in (ev.CLUSTER_SPEC, ev.TF_CONFIG)}
        env.update(pool.env)
        env.update({
            ev.CLUSTER_SPEC: json.dumps(spec),
            ev.TF_CONFIG: json.dumps(vertex_tf_config(spec)),
            ev.AIP_MODEL_DIR: f"{base}/model/",
            ev.AIP_CHECKPOINT_DIR: f"{base}/checkpoints/",
            ev.AIP_TENSORBOARD_LOG_DIR: f"{base}/logs/",
            # Where the emulated platform collects this replica's tuning metrics (Vertex reads the
            # container's own /tmp/hypertune file; here it survives the replica for `local` to show).
            ev.CLOUD_ML_HP_METRIC_FILE: str(metrics_root / METRICS_DIR / name / "hypertune" / "output.metrics"),
            ev.TRAINER_REPLICA: name,
            ev.TRAINER_CPUS: str(share),
            ev.PYTHONUNBUFFERED: "1",
        })
        if trial:
            env[ev.CLOUD_ML_TRIAL_ID] = trial
        replicas.append(Replica(pool.name, index, env, [sys.executable, "-m", "entrypoint", *pool.command]))
    return replicas


class Disks:
    """Each replica's own disk, as a container has one: a working directory and a temp dir, fresh per start.

    They live under the system's temp dir, never under the job's output dir (which is shared, like a
    bucket, and may be synced somewhere). The working directory starts as a view of the directory
    ``local`` runs in, one link per entry (the image's WORKDIR holds the user's code); what a replica
    writes there is its own, and a restarted replica starts from a fresh view, as a new container does.
    The root names its owner (``owner.json``): a ``local`` that was SIGKILLed cannot remove its disks, so each
    ``local`` removes, as it starts, those whose owner is gone (``remove_stale``).
    """

    def __init__(self, source: Path) -> None:
        self.source = source
        remove_stale(Path(tempfile.gettempdir()))
        self.root = Path(tempfile.mkdtemp(prefix=DISKS_PREFIX))
        owner = self.root / f".{OWNER}.partial"
        owner.write_text(json.dumps(_owner(os.getpid())))
        owner.replace(self.root / OWNER)  # whole or absent: a root without one is never judged

    def prepare(self, replica: Replica) -> None:
        """Fresh directories for this start of ``replica``; its attempt number in the environment."""
        home = self.root / replica.name
        shutil.rmtree(home, ignore_errors=True)
        work, tmp = home / "work", home / "tmp"
        tmp.mkdir(parents=True)
        work.mkdir()
        with os.scandir(self.source) as entries:
            for entry in entries:
                (work / entry.name).symlink_to(Path(entry.path).resolve())
        replica.cwd = str(work)
        replica.env[ev.TMPDIR] = str(tmp)
        replica.env[ev.TRAINER_RESTART_COUNT] = str(replica.attempt)

    def remove(self) -> None:
        """The job is over: its replicas' disks go, as their containers do."""
        shutil.rmtree(self.root, ignore_errors=True)


def _owner(pid: int) -> dict[str, object]:
    """Who owns a disks root: ``local``'s process (its start tells a reused pid apart) on this host, boot and pid
    namespace (its pid means nothing in another one)."""
    return {"host": socket.gethostname(), "pid": pid, "started": lease.start_ticks(pid),
            "pidns": lease.pid_namespace(), "boot": lease.boot_id()}


def owner_gone(root: Path) -> bool:
    """Whether the ``local`` that made the disks root ``root`` no longer runs, judged safely: its owner file names
    this host and this pid namespace, and its pid is gone or now another process's (or the machine rebooted since).
    A root without a readable owner (being made, or an older version's) is never judged gone."""
    try:
        owner = json.loads((root / OWNER).read_text())
    except (OSError, ValueError):
        return False
    me = _owner(os.getpid())
    if not isinstance(owner, dict) or owner.get("host") != me["host"]:
        return False
    if owner.get("boot") and me["boot"] and owner["boot"] != me["boot"]:
        return True  # every process of that boot is gone
    pid = owner.get("pid")
    if not owner.get("pidns") or owner.get("pidns") != me["pidns"] or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    started = owner.get("started")
    return bool(started) and lease.start_ticks(pid) != started


def remove_stale(temp: Path) -> list[Path]:
    """Remove the disks roots under ``temp`` whose ``local`` is gone (SIGKILLed before it could); those removed."""
    removed = []
    for root in sorted(temp.glob(f"{DISKS_PREFIX}*")):
        if root.is_dir() and not root.is_symlink() and owner_gone(root):
            shutil.rmtree(root, ignore_errors=True)
            removed.append(root)
    if removed:
        print(f"[local] removed {len(removed)} replica disk(s) a stopped local left: "
              f"{', '.join(str(r) for r in removed)}", flush=True)
    return removed


def replica_grace(pools: Sequence[Pool]) -> float:
    """How long ``local`` waits for stopping replicas: their own ``--grace-period`` plus a margin.

    A replica forwards the signal to its own processes and kills them after its grace period; the
    emulator waits a little longer, so it never kills a replica that is still saving on time.
    """
    graces = [parse_options("run", p.command[1:]).grace_period for p in pools if p.start and p.command[:1] == ("run",)]
    return max(graces, default=DEFAULT_GRACE_PERIOD) + GRACE_MARGIN


def replica_records(replicas: Sequence[Replica]) -> tuple[str, ...]:
    """Where each replica's processes write the records the job dir did not take: its own temp dir (the job dir's
    fallback, and the record of a job refused its job dir), read by ``local`` before its disks go."""
    temps = [Path(r.env[ev.TMPDIR]) for r in replicas if ev.TMPDIR in r.env]
    return tuple(str(place) for t in temps for place in (t / FALLBACK_DIR, t / REFUSED / FAILURES_DIR))


def _record_exit(ctx: failures.FailureContext) -> Callable[[Replica, int], None]:
    """A failed replica that left no failure record of its own (SIGKILLed, say) gets one on its behalf."""

    def record(replica: Replica, code: int) -> None:
        found = read_records(ctx.job_dir, replica.started_at, ctx.before, replica_records([replica]))
        mine = [r for r in current(found, {replica.name: replica.started_at})
                if r.replica == replica.name and not r.reported_by]
        if not mine:
            failures.write_record(replace(ctx, replica=replica.name, rank=None), failures.exit_failure(code))

    return record


def run_cluster(pools: Sequence[Pool], output_dir: str, trial: str | None = None,
                policy: RestartPolicy | None = None) -> int:
    """Start every pool's replicas, handle their failures as the platform would, and say where outputs went."""
    policy = policy or RestartPolicy()
    if trial is not None:  # a directory under --output-dir, as on the platform: never a path out of it
        trial = get_trial("--trial", {"trial": trial}, "")
    for pool in pools:
        if pool.start and (not pool.command or pool.command[0] not in COMMANDS):
            raise ConfigError("local", f"{pool.name}: the replica command must start with 'run' or 'describe'")
        if not pool.start:
            print(f"[local] {pool.name}: {pool.replicas} replica(s) listed in CLUSTER_SPEC, not started: {pool.note}",
                  flush=True)
    run_started = time.time()  # a record from before is an earlier run's (same host: no clock skew)
    replicas = build_replicas(pools, output_dir, trial, {**os.environ, ev.TRAINER_RUN_STARTED: f"{run_started:.6f}"})
    output = _output_base(output_dir)
    job_dir = f"{output}/{trial}" if trial else output
    # A live job's dir, or another job's (another framework or code): refused before any replica starts, nothing
    # written there.
    chief = next((pool for pool in pools if pool.start and pool.command[:1] == ("run",)), None)
    refused = lease.in_use(job_dir) or (None if chief is None else jobrecord.refusal_of_run(
        job_dir, chief.command[1:], {**os.environ, **dict(chief.env)}))
    if refused is not None:
        raise refused
    # Records already there are an earlier run's, even one written a moment ago (read_records allows clock skew).
    ctx = failures.FailureContext(replica="local", job_dir=job_dir, started=run_started, run_started=run_started,
                                  before=record_names(job_dir))
    platform = PlatformRecorder(job_dir)  # the job ledger's submission and end, as the platform sees them
    disks = Disks(Path.cwd())
    signals.adopt_orphans()  # what a replica's user code leaves behind is ended with the job, as in a container
    names = ", ".join(r.name for r in replicas)
    cpus = replicas[0].env[ev.TRAINER_CPUS] if replicas else "0"
    print(f"[local] starting {len(replicas)} replicas ({names}); outputs under {output}; each replica's own disk "
          f"under {disks.root}; {host_cpus(os.environ)} CPU(s) shared: {ev.TRAINER_CPUS}={cpus} each\n"
          f"[local] {policy.describe()}", flush=True)
    try:
        try:
            secrets = secret_values() | frozenset(secrets_in_args([a for pool in pools for a in pool.command]))
            outcome = Supervisor(replicas, grace=replica_grace(pools), policy=policy, prepare=disks.prepare,
                                 on_failure=_record_exit(ctx), secrets=secrets, tend=lambda: signals.reap_adopted(
                                     r.proc.pid for r in replicas if r.proc is not None)).run()  # adopted, ended
        finally:
            signals.end_adopted(r.proc.pid for r in replicas if r.proc is not None)
        # The job's end as the platform sees it: its replicas are gone. Recorded before the report, whose goodput
        # line is then the one `goodput` reads from the same ledger afterwards.
        platform.ended(outcome.code)
        return _report(outcome, replicas, output_dir, ctx)
    finally:
        disks.remove()  # after the report: it reads the records the replicas' disks hold
        platform.ended(None)  # a local that failed itself (nothing recorded yet): its end all the same


def _goodput_line(job_dir: str) -> str:
    """The job's goodput from its ledger, as ``python -m entrypoint goodput JOB_DIR`` reads it (which tells the rest):
    why it is 0 when it is."""
    try:
        return f"{goodput.of_job(job_dir).line()} (python -m entrypoint goodput {job_dir})"
    except Exception as exc:
        return f"goodput unknown: the job ledger could not be read ({type(exc).__name__}: {exc})"


def written(directory: str) -> bool:
    """Whether the output directory ``directory`` holds anything (a local path or a store's URL)."""
    try:
        place = storage.path(directory.rstrip("/"))
        return place.is_dir() and any(True for _ in place.iterdir())
    except (OSError, storage.StorageError):
        return False


def _outputs(chief: Mapping[str, str], metrics: list[Path]) -> list[str]:
    """The outputs the job wrote where the platform points (an empty directory is not one); its tuning metrics."""
    places = (("model", ev.AIP_MODEL_DIR), ("checkpoints", ev.AIP_CHECKPOINT_DIR),
              ("tensorboard", ev.AIP_TENSORBOARD_LOG_DIR))
    found = [f"{name + ':':<13}{chief[variable]}" for name, variable in places if written(chief[variable])]
    if not found:  # a script that saved nothing where the platform's variables point
        found = [f"{'outputs:':<13}none under {chief[ev.AIP_MODEL_DIR].rstrip('/').rsplit('/', 1)[0]} (no model, "
                 f"checkpoint or TensorBoard files where {ev.AIP_MODEL_DIR} and the others point)"]
    return [*found, f"{'hypertune:':<13}{', '.join(map(str, metrics)) or 'none reported'}"]


def _report(outcome: Outcome, replicas: list[Replica], output_dir: str, ctx: failures.FailureContext) -> int:
    """Say how the job ended and where its outputs went; its exit code, the root cause's when it failed."""
    chief = replicas[0].env
    metrics = sorted(_metrics_root(output_dir).glob(f"{METRICS_DIR}/*/hypertune/output.metrics"))
    restarts = f" after {outcome.counts.replica_restarts} replica restart(s)" if outcome.counts.replica_restarts else ""
    restarts += f" and {outcome.counts.job} job restart(s)" if outcome.counts.job else ""
    print(f"[local] job finished with exit code {outcome.code}{restarts}", flush=True)
    print("\n".join(f"[local] {line}" for line in _outputs(chief, metrics)), flush=True)
    if ctx.job_dir is not None:
        print(f"[local] {_goodput_line(ctx.job_dir)}", flush=True)
    if outcome.code == ExitCode.OK:
        return ExitCode.OK
    # The root cause among the records of the job's latest attempt: a failure of a replica restarted since is one
    # the job recovered from (a later end, a SIGTERM say, is the job's). A budget that ran out is said.
    first = outcome.first  # None: a signal stopped the job
    latest = replace(ctx, starts={r.name: r.started_at for r in replicas}, private=replica_records(replicas))
    exhausted = bool(outcome.counts.replica_restarts or outcome.counts.job) and is_retryable(outcome.code)
    return failures.finish_child(latest, outcome.code, who=first.name if first else None,
                                 note=outcome.why if exhausted and first else "")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """``local`` options before ``--``; the replica command (``run ...``) after it, as ``args.command``."""
    argv = list(argv)
    ours, command = split_user_args(argv)
    parser = Parser(prog="python -m entrypoint local", description=__doc__.splitlines()[0])
    parser.stray = "the replica command goes after '--': python -m entrypoint local [options] -- run ..."
    parser.add_argument("--workers", type=int, default=1, help="training replicas: 1 chief + N-1 workers")
    parser.add_argument("--ps", type=int, default=0, help="parameter servers (workerpool2)")
    parser.add_argument("--evaluators", type=int, default=0, help="evaluators (workerpool3)")
    parser.add_argument("--trial", help="emulate a hyperparameter-tuning trial with this id")
    parser.add_argument("--output-dir", default=None, help="the job's base output directory (default ./outputs, "
                        "or the replica command's --job-dir)")
    restarts = parser.add_argument_group("when a replica fails (docs/recovery.md)")
    restarts.add_argument("--restart-policy", choices=POLICIES, default=None,
                          help="vertex (default): restart a replica exiting >= 128 in place; job: restart every "
                          "replica (restartJobOnWorkerRestart); exitcode: Kubeflow's ExitCode policy; never: stop")
    restarts.add_argument("--max-restarts", type=int, default=VERTEX_RESTARTS_PER_REPLICA,
                          help="vertex: restarts per replica; job: restarts of the whole job (default 5, as Vertex)")
    restarts.add_argument("--job-retries", type=int, default=VERTEX_JOB_RETRIES,
                          help="vertex: whole-job retries once a replica used its restarts (default 3, as Vertex)")
    restarts.add_argument("--backoff-limit", type=int, default=DEFAULT_BACKOFF_LIMIT,
                          help="exitcode: restarts of all replicas together (Kubeflow's runPolicy.backoffLimit)")
    parser.add_argument("--spec", metavar="FILE", help="run a Vertex CustomJob / CustomJobSpec / gcloud --config "
                        "file (JSON or YAML) instead of --workers/--ps/--evaluators and '-- run ...'")
    args = parser.parse_args(ours)
    args.command = command
    if args.spec is not None:
        if "--" in argv or any(a.split("=", 1)[0] in ("--workers", "--ps", "--evaluators") for a in ours):
            raise ConfigError("local", "--spec takes the pools and their args from the file: drop --workers, "
                              "--ps, --evaluators and '-- run ...'")
        args.output_dir = args.output_dir or "./outputs"
        return args
    if "--" not in argv:
        raise ConfigError("local", "expected '-- run ...' after the local options (or --spec FILE)")
    if args.workers < 1 or args.ps < 0 or args.evaluators < 0:
        raise ConfigError("local", "--workers must be >= 1; --ps and --evaluators >= 0")
    if not args.command or args.command[0] not in COMMANDS:
        raise ConfigError("local", "the replica command after '--' must start with 'run' or 'describe'")
    args.output_dir = _output_dir(args.output_dir, args.command)
    return args


def _output_dir(given: str | None, command: Sequence[str]) -> str:
    """``--output-dir``, else the replica command's own ``--job-dir`` (before its ``--``), else ``./outputs``: local
    sets every replica's ``AIP_*`` directories from it (Vertex's baseOutputDirectory), so a ``run --job-dir`` of its
    own is taken as the job's, or the model and the job's records would land in two places."""
    try:
        named = parse_options(command[0], command[1:]).job_dir
    except ConfigError:  # the replicas say what is wrong with their command
        named = None
    if not named:
        return given or "./outputs"
    if given is not None and _output_base(given) != _output_base(named):
        raise ConfigError("local", f"--output-dir {given} and the replica command's --job-dir {named} name two "
                          "job dirs: give one (local's --output-dir sets every replica's)")
    return named


def restart_policy(args: argparse.Namespace, kind: str = "vertex") -> RestartPolicy:
    """``--restart-policy`` (else ``kind``, what a job spec's scheduling asks for) and its budgets."""
    return RestartPolicy(args.restart_policy or kind, args.max_restarts, args.job_retries, args.backoff_limit)


def main(argv: Sequence[str]) -> int:
    """Run the emulated cluster and return the job's exit code (the root cause's, when it fails)."""
    args = parse_args(argv)
    if args.spec is not None:
        from entrypoint.local.specfile import spec_pools

        job = spec_pools(args.spec)
        kind = "never" if job.disable_retries else "job" if job.restart_job_on_worker_restart else "vertex"
        return run_cluster(job.pools, args.output_dir, args.trial or job.trial, restart_policy(args, kind))
    return run_cluster(vertex_pools(args.workers, args.ps, args.evaluators, args.command), args.output_dir,
                       args.trial, restart_policy(args))
