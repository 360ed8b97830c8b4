"""Jobs checked by planning: each replica gets the variables its platform will set, and the framework's own planner
(``planning.plan.make_plan``) decides for it what ``run`` will decide there.

So a run-time configuration error (a strategy that cannot run on this cluster, a replica role the framework does
not serve, another framework's flag, a bad value in the pool's env) is the job's error when the job is written,
in the planner's own words; jobs/ keeps only the platform's rules (machines, reducers, pool counts). The user's
code is not looked for: it lives in the image. Vertex AI replicas get CLUSTER_SPEC and TF_CONFIG as
``local`` writes them (``jobs.replicaenv``); Kubeflow's are written by ``jobs.kubeflow``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments import read_settings, resolve
from entrypoint.errors import ConfigError
from entrypoint.jobs import network
from entrypoint.jobs.args import run_options, with_run_option
from entrypoint.jobs.images import parse_image
from entrypoint.jobs.model import JobSpec, PoolSpec
from entrypoint.jobs.replicaenv import Pool, cluster_specs, vertex_tf_config
from entrypoint.planning import registry
from entrypoint.planning.plan import Plan, make_plan

# Variables the job's platform writes for each replica (ours to fill in here): named in an error, they would
# point at something the user never wrote, so the error names the replica instead.
_WRITTEN_HERE = (ev.CLUSTER_SPEC, ev.TF_CONFIG, ev.PET_NNODES, ev.PET_NODE_RANK, ev.PET_NPROC_PER_NODE,
                 ev.PET_MASTER_ADDR, ev.PET_MASTER_PORT)
_POOL_ROLES = ("the chief", "workers", "parameter servers", "evaluators")


@dataclass(frozen=True)
class Replica:
    """One replica as its platform starts it: where it is, its variables and container env, args, GPUs."""

    label: str  # "workerpool0 (the chief)", "Master"
    environ: Mapping[str, str]
    args: tuple[str, ...]
    gpus: int


def plan_replica(replica: Replica, framework: str | None, source: str) -> Plan:
    """The plan ``run`` will make in ``replica``; its ConfigError as the job's, naming the replica."""
    options = run_options(replica.args, source)
    environ = {**({ev.TRAINER_FRAMEWORK: framework} if framework else {}), **replica.environ}
    try:
        return make_plan(resolve(environ), replace(options, module=None, script=None), read_settings(environ),
                         replica.gpus)
    except ConfigError as exc:
        what = exc.problem if exc.source.split(":")[0] in _WRITTEN_HERE else str(exc)
        raise ConfigError(source, f"{replica.label} at run time: {what}") from None


def _gpus(pool: PoolSpec) -> int:
    """The GPUs our image sees on the pool's machine (none in a CPU variant)."""
    if pool.accelerator is None or not pool.accelerator[0].startswith("NVIDIA") or parse_image(pool.image_uri).cpu:
        return 0
    return pool.accelerator[1]


def _output_dirs(job: JobSpec) -> dict[str, str]:
    """AIP_MODEL_DIR & co., as Vertex AI sets them under baseOutputDirectory."""
    if not job.base_output_dir:
        return {}
    base = job.base_output_dir.rstrip("/")
    return {ev.AIP_MODEL_DIR: f"{base}/model/", ev.AIP_CHECKPOINT_DIR: f"{base}/checkpoints/",
            ev.AIP_TENSORBOARD_LOG_DIR: f"{base}/logs/"}


def vertex_replicas(job: JobSpec) -> list[Replica]:
    """The first replica of each pool on the chief's image (ours), with the variables Vertex AI sets in it."""
    chief = job.pool(0)
    assert chief is not None
    present = job.present()
    addresses = (f"{p.name}-{i}:2222" for p in present for i in range(p.replicas))
    specs = cluster_specs([Pool(p.name, p.replicas) for p in present], None, addresses)
    ours = {p.name: p for p in present if p.image_uri == chief.image_uri and not network.is_reduction_server(
        p.image_uri)}
    replicas = []
    for pool, index, spec in specs:
        spec_pool = ours.get(pool.name)
        if spec_pool is None or index != 0:
            continue
        environ = {**dict(spec_pool.env), **_output_dirs(job), ev.CLUSTER_SPEC: json.dumps(spec),
                   ev.TF_CONFIG: json.dumps(vertex_tf_config(spec))}
        replicas.append(Replica(f"{pool.name} ({_POOL_ROLES[spec_pool.index]})", environ, spec_pool.args,
                                _gpus(spec_pool)))
    return replicas


def reducer_strategy(replica: Replica, framework: str | None, source: str) -> str | None:
    """The first of the framework's strategies under which the replica reads workerpool2 as a Reduction Server."""
    strategies = registry.get(framework).strategies if framework in registry.names() else ()
    for strategy in strategies:
        pinned = replace(replica, args=with_run_option(replica.args, "--strategy", strategy))
        try:
            if plan_replica(pinned, framework, source).server_pool == "reduction_server":
                return strategy
        except ConfigError:
            continue
    return None


def check_vertex(job: JobSpec, source: str, framework: str | None) -> list[Plan]:
    """Plan every pool of ours; the chief's reading of workerpool2 must be what workerpool2 is."""
    replicas = vertex_replicas(job)
    plans = [plan_replica(r, framework, source) for r in replicas]
    servers = job.pool(2)
    if servers is None or not plans:
        return plans
    chief = plans[0]
    reducers = network.is_reduction_server(servers.image_uri)
    if reducers and chief.server_pool != "reduction_server":
        if chief.options.strategy is not None:
            raise ConfigError(source, f"a Reduction Server cannot serve {chief.strategy}: workerpool2 is either "
                              "parameter servers or reducers")
        pin = reducer_strategy(replicas[0], framework, source)
        label = registry.get(chief.framework).label
        hint = f"needs --strategy {pin} in the args" if pin else "cannot use one"
        raise ConfigError(source, f"{label} with a Reduction Server in workerpool2 {hint}: without it, workerpool2 "
                          f"reads as parameter servers at run time ({chief.strategy})")
    if not reducers and chief.server_pool == "reduction_server":
        raise ConfigError(source, f"workerpool2 runs our image, but {chief.framework} with {chief.strategy} reads it "
                          "as a Reduction Server (Google's reductionserver image)")
    return plans


# Kubeflow's replica types per kind, by role (TrainJob: its runtime's nodes).
KUBEFLOW_REPLICAS = {
    "pytorchjob": {"chief": "Master", "worker": "Worker"},
    "tfjob": {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"},
    "trainjob": {"chief": "node 0", "worker": "node 1"},
}
TORCH_PORT = "23456"  # the operators' default master port
TF_PORT = "2222"


def kubeflow_replicas(kind: str, name: str, args: tuple[str, ...], env: Mapping[str, str],
                      counts: Mapping[str, int], gpus: Mapping[str, int]) -> list[Replica]:
    """The first replica of each role, with the variables the operator sets: PET_* (PyTorchJob, TrainJob's torch
    runtime) or TF_CONFIG (TFJob; the evaluator outside the cluster, as the operator writes it)."""
    types = KUBEFLOW_REPLICAS[kind]
    roles = [role for role in types if counts.get(role, 0) > 0]
    out = []
    for role in roles:
        if kind == "tfjob":
            cluster = {r: [f"{name}-{r}-{i}:{TF_PORT}" for i in range(counts[r])] for r in roles if r != "evaluator"}
            variables = {ev.TF_CONFIG: json.dumps({"cluster": cluster, "task": {"type": role, "index": 0},
                                                   "environment": "cloud"})}
        else:
            variables = {ev.PET_NNODES: str(counts["chief"] + counts.get("worker", 0)),
                         ev.PET_NODE_RANK: "0" if role == "chief" else "1",
                         ev.PET_NPROC_PER_NODE: str(gpus.get(role) or 1),
                         ev.PET_MASTER_ADDR: f"{name}-master-0", ev.PET_MASTER_PORT: TORCH_PORT}
        out.append(Replica(types[role], {**env, **variables}, args, gpus.get(role, 0)))
    return out
