"""``local --spec FILE``: a CustomJob, a HyperparameterTuningJob or a gcloud ``--config`` file as emulated pools.

Every pool on our image becomes local processes running ``run <containerSpec.args>`` (the image's
ENTRYPOINT); a pool on Google's Reduction Server image is listed in CLUSTER_SPEC but not started. A tuning
job runs one trial: its trialJobSpec, with each parameter's value appended to the args as Vertex AI does.
What a spec asks of the platform that has no meaning here (Spot VMs, a service account, a network, disks)
is named on one line and otherwise ignored.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from typing import Any

from entrypoint.cluster import envvars as ev
from entrypoint.errors import ConfigError
from entrypoint.jobs import network
from entrypoint.jobs.args import infer_framework, run_options
from entrypoint.jobs.model import JobSpec, PoolSpec
from entrypoint.jobs.replicaenv import Pool
from entrypoint.jobs.specdoc import SOURCE, Document, job_from_document, read_document
from entrypoint.jobs.vertex.params import trial_values
from entrypoint.jobs.vertex.rules import validate

DEFAULT_TRIAL = "1"
# Fields local --spec reads (the rest is named as not emulated): pools, their machines and containers,
# the output directory, and the two scheduling flags the emulator's restart policy follows.
_HANDLED = ("jobSpec", "workerPoolSpecs", "replicaCount", "machineSpec", "containerSpec", "pythonPackageSpec",
            "scheduling", "restartJobOnWorkerRestart", "disableRetries", "baseOutputDirectory", "studySpec",
            "trialJobSpec")


@dataclass(frozen=True)
class LocalJob:
    """What ``local --spec`` runs: the pools, the scheduling flags the emulator follows, a tuning job's trial id."""

    pools: list[Pool]
    restart_job_on_worker_restart: bool = False
    disable_retries: bool = False
    trial: str | None = None  # the trial a tuning job runs when local gets no --trial


def _replica_command(pool: PoolSpec) -> tuple[str, ...]:
    """What the image would run: its ENTRYPOINT (``python -m entrypoint run``) + the args."""
    if pool.command and " ".join(pool.command[-3:]) not in ("-m entrypoint run", "trainer-entrypoint run"):
        raise ConfigError(SOURCE, "replaces the image's ENTRYPOINT; local --spec runs `entrypoint run ARGS` only",
                          f"workerPoolSpecs[{pool.index}].containerSpec.command")
    return ("run", *pool.args)


def to_pools(job: JobSpec, framework: str | None = None) -> list[Pool]:
    """The emulator's pools: those on the chief's image (ours) started, the others only listed. ``framework`` is
    the image's (its TRAINER_FRAMEWORK, beneath the pool's containerSpec.env as in the image)."""
    ours = job.pools[0].image_uri if job.pools[0] else ""
    image_env = ((ev.TRAINER_FRAMEWORK, framework),) if framework else ()
    pools = []
    for spec in job.present():
        if spec.image_uri == ours:
            pools.append(Pool(spec.name, spec.replicas, _replica_command(spec), env=(*image_env, *spec.env)))
        elif spec.index == 1:
            raise ConfigError(SOURCE, "the workers run another image than the chief; local --spec runs the "
                              "chief's image (ours) only", "workerPoolSpecs[1].containerSpec.imageUri")
        elif network.is_reduction_server(spec.image_uri):
            pools.append(Pool(spec.name, spec.replicas, start=False,
                              note="Google's Reduction Server image, not ours (reducers are not part of the world)"))
        else:
            pools.append(Pool(spec.name, spec.replicas, start=False, note="another image than the chief's (ours)"))
    return pools


def not_emulated(fields: tuple[str, ...]) -> list[str]:
    """The fields present that local --spec ignores, once each (``workerPoolSpecs[*].diskSpec``)."""
    out: list[str] = []
    for path in fields:
        if path.rsplit(".", 1)[-1] in _HANDLED:
            continue
        name = re.sub(r"\[\d+\]", "[*]", path)
        if name not in out:
            out.append(name)
    return out


def _hypertune_metric(args: tuple[str, ...]) -> str | None:
    return run_options(args, SOURCE).hypertune_metric


def trial_job(job: JobSpec, study: dict[str, Any]) -> tuple[JobSpec, str]:
    """The tuning job's trial: our pools' args with ``--ID=VALUE`` appended; and the line that says so."""
    chief = job.pool(0)
    assert chief is not None
    parameters = study.get("parameters")
    if not isinstance(parameters, list) or not parameters:
        raise ConfigError(SOURCE, "a tuning job needs parameters", "studySpec.parameters")
    values = trial_values(parameters, SOURCE)
    if "--" not in chief.args:
        raise ConfigError(SOURCE, "Vertex AI appends each trial's --PARAMETER=VALUE to the args, and these have no "
                          "'--' for them to follow: run would reject them; end the args with '--'",
                          "trialJobSpec.workerPoolSpecs[0].containerSpec.args")
    raw_metrics = study.get("metrics")
    metrics: list[Any] = raw_metrics if isinstance(raw_metrics, list) else []
    ids = [m.get("metricId", m.get("metric_id")) if isinstance(m, dict) else None for m in metrics]
    for i, ident in enumerate(ids):
        if not isinstance(ident, str) or not ident or re.search(r"\s", ident):
            raise ConfigError(SOURCE, "must be a metric id without whitespace", f"studySpec.metrics[{i}].metricId")
    metric = ids[0] if ids else None
    reported = _hypertune_metric(chief.args)
    if metric and reported and reported != metric:
        raise ConfigError(SOURCE, "run's --hypertune-metric differs from the study's metric: the study would wait "
                          "for a metric the trials never report", "studySpec.metrics[0].metricId")
    extra = tuple(f"--{k}={v}" for k, v in values)
    pools = tuple(replace(p, args=(*p.args, *extra)) if p is not None and p.image_uri == chief.image_uri else p
                  for p in job.pools)
    line = (f"[local] tuning job ({study.get('maxTrialCount') or '?'} trials, metric {metric or '?'}): running one "
            f"trial with {' '.join(extra)} (the middle of each range, the first of each list; Vertex AI's study "
            "picks each trial's values)")
    return replace(job, pools=pools), line


def _report(job: JobSpec, doc: Document) -> None:
    for spec in job.present():
        print(f"[local] {spec.name}: {spec.replicas} x {spec.machine_text()} (machine and accelerators are not "
              f"emulated here), image {spec.image_uri}", flush=True)
    if job.base_output_dir:
        print(f"[local] baseOutputDirectory {job.base_output_dir} is Vertex's; outputs go under --output-dir",
              flush=True)
    mounts = _mount_paths(job)
    if mounts:
        print(f"[local] not mounted here: {', '.join(mounts)} (the job's NFS and Lustre shares); the replicas read "
              "and write this machine's directories at those paths, where they exist", flush=True)
    ignored = not_emulated(doc.fields)
    if ignored:
        print(f"[local] not emulated here (the platform's to apply): {', '.join(ignored)}", flush=True)


def _mount_paths(job: JobSpec) -> list[str]:
    """Where Vertex AI mounts the pools' shares: /mnt/nfs/<mountPoint>, /mnt/lustre/<mountPoint>, once each."""
    paths = [f"/mnt/nfs/{m[2]}" for p in job.present() for m in p.nfs_mounts]
    paths += [f"/mnt/lustre/{m[3]}" for p in job.present() for m in p.lustre_mounts]
    return list(dict.fromkeys(paths))


def spec_pools(path: str) -> LocalJob:
    """Read, check and report the job in FILE; return what to emulate."""
    doc = job_from_document(read_document(path))
    job = doc.job
    chief = job.pool(0)
    if chief is None:
        raise ConfigError(SOURCE, "workerPoolSpecs[0] (the chief) is empty: every job has one primary replica")
    options = run_options(chief.args, SOURCE)
    framework = infer_framework(None, chief.image_uri, options.framework)
    trial_line = None
    if doc.study is not None:
        job, trial_line = trial_job(job, doc.study)
    for warning in validate(job, SOURCE, framework):
        print(f"entrypoint: warning: {warning}", file=sys.stderr, flush=True)
    _report(job, doc)
    if trial_line:
        print(trial_line, flush=True)
    s = job.settings
    if framework is not None:
        print(f"[local] framework {framework} (the job's image sets TRAINER_FRAMEWORK={framework})", flush=True)
    return LocalJob(to_pools(job, framework), s.restart_job_on_worker_restart, s.disable_retries,
                    DEFAULT_TRIAL if doc.study is not None else None)
