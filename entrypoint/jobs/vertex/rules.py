"""The platform's rules a job must keep before it costs anything: pool layout, reducers, machines, GPUs and CUDA.

Shared by ``job vertex`` (checking what it built) and ``local --spec`` (checking what it was given). What would go
wrong at run time inside a replica is not re-derived here: ``jobs.planned`` asks the framework's own planner.
Errors are ConfigError (one line, exit 2); what is merely unwise comes back as warnings.
"""

from __future__ import annotations

from entrypoint.errors import ConfigError
from entrypoint.jobs import machines, network, planned
from entrypoint.jobs.images import parse_image
from entrypoint.jobs.model import JobSpec, PoolSpec
from entrypoint.jobs.vertex.pools import MAX_ENV
from entrypoint.planning import registry

FLEX_START = "--flex-start (scheduling.strategy FLEX_START)"
MAX_FLEX_START_TIMEOUT = 7 * 24 * 3600


def _is_gpu(pool: PoolSpec | None) -> bool:
    return pool is not None and pool.accelerator is not None and pool.accelerator[0].startswith("NVIDIA")


def _check_reducers(job: JobSpec, source: str) -> list[str]:
    reducers = job.pool(2)
    assert reducers is not None
    chief, workers = job.pool(0), job.pool(1)
    if reducers.accelerator is not None or machines.implied_accelerator(reducers.machine_type):
        raise ConfigError(source, "the Reduction Server pool (workerpool2) must have no accelerators "
                          "(use n1-highcpu-16)")
    if not (_is_gpu(chief) and (workers is None or _is_gpu(workers))):
        raise ConfigError(source, "a Reduction Server needs GPU training pools (it serves NCCL all-reduce); "
                          "add an accelerator or drop the reducers")
    training = 1 + (workers.replicas if workers else 0)
    if training < 2:
        raise ConfigError(source, "a Reduction Server needs at least 2 training VMs (chief + workers)")
    assert chief is not None
    warnings = []
    if chief.machine_type.startswith(machines.RDMA_MACHINES):
        warnings.append(f"{chief.machine_type}: reducers move the all-reduce off its RDMA NICs (CX-7, gIB) onto the "
                        "general-purpose NIC, a fraction of their bandwidth: drop the reducers (docs/fabric.md)")
    if not network.carries_plugin(chief.image_uri):
        warnings.append(f"{parse_image(chief.image_uri).name}: neither its name nor its tag says it carries the "
                        "Reduction Server NCCL plugin (our REDUCTION_SERVER=1 builds are tagged -rs); without it "
                        "the reducers are billed and idle")
    per_vm = network.training_bandwidth(chief.machine_type, chief.accelerator)
    per_reducer = network.reducer_bandwidth(reducers.machine_type)
    if per_vm is None or per_reducer is None:
        return warnings
    needed = network.reducers_needed(training, per_vm, per_reducer)
    if reducers.replicas < needed:
        warnings.append(f"{reducers.replicas} reducers give {reducers.replicas * per_reducer} Gbps, less than the "
                        f"{training} training VMs' {training * per_vm} Gbps of general-purpose network: {needed} "
                        "would match it (--reduction-servers auto)")
    return warnings


def image_cuda(image_uri: str, framework: str | None) -> int | None:
    """The CUDA major version of our GPU image for ``framework`` (None for a CPU variant or another image)."""
    if parse_image(image_uri).cpu or framework not in registry.names():
        return None
    return registry.get(framework).cuda_major


def _check_image_gpus(pool: PoolSpec, source: str, framework: str | None) -> list[str]:
    """Refuse GPUs the image's CUDA cannot run; warn about GPUs a CPU image leaves idle."""
    if not _is_gpu(pool):
        return []
    assert pool.accelerator is not None
    image = parse_image(pool.image_uri)
    if image.cpu:
        return [f"{pool.name}: {image.name} is a CPU image; the {pool.accelerator[0]} GPUs would sit idle"]
    cuda = image_cuda(pool.image_uri, framework)
    why = machines.cuda_refusal(pool.accelerator[0], cuda) if cuda else None
    if why:
        raise ConfigError(source, f"{pool.name}: our {framework} GPU image is built on CUDA {cuda}; {why}")
    return []


def _check_layout(job: JobSpec, source: str) -> None:
    chief = job.pool(0)
    if chief is None:
        raise ConfigError(source, "workerpool0 (the chief) is missing: every job has one primary replica")
    if chief.replicas != 1:
        raise ConfigError(source, f"workerpool0 (the chief) must have exactly 1 replica, not {chief.replicas}")
    if len(job.pools) > 4:
        raise ConfigError(source, f"{len(job.pools)} worker pools; Vertex AI has 4 (chief, workers, ps/reducers, "
                          "evaluators)")
    for pool in job.present():
        if pool.replicas < 1:
            raise ConfigError(source, f"{pool.name} has {pool.replicas} replicas; leave an unused pool empty")


def _check_flex_start(job: JobSpec, source: str) -> None:
    """Dynamic Workload Scheduler: L4/A100/H100/H200/B200 only, at most 7 days, one machine configuration in every pool
    (https://cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws)."""
    chief = job.pool(0)
    assert chief is not None
    why = machines.flex_start_refusal(chief.accelerator)
    if why:
        raise ConfigError(source, f"{FLEX_START}: {why}")
    if job.settings.timeout_s is not None and job.settings.timeout_s > MAX_FLEX_START_TIMEOUT:
        raise ConfigError(source, f"{FLEX_START}: the job's timeout may be at most 7 days (--timeout 7d)")
    machine = _configuration(chief)
    for pool in job.present():
        if _configuration(pool) != machine:
            role = "a Reduction Server" if network.is_reduction_server(pool.image_uri) else pool.machine_text()
            raise ConfigError(source, f"{FLEX_START}: Dynamic Workload Scheduler needs the same machine "
                              f"configuration in every pool, and {pool.name} is {role}, not {chief.machine_text()}")


def _configuration(pool: PoolSpec) -> tuple[object, ...]:
    return pool.machine_type, pool.accelerator, pool.disk_type, pool.disk_size_gb


def _check_pool(pool: PoolSpec, source: str) -> None:
    """A pool's boot disk, env count and reservation, which the API (or the VMs) refuse."""
    why = machines.boot_disk_refusal(pool.machine_type, pool.disk_type)
    if why:
        raise ConfigError(source, f"{pool.name} boot disk: {why}")
    if len(pool.env) > MAX_ENV:
        raise ConfigError(source, f"{pool.name}: {len(pool.env)} environment variables; a container takes at most "
                          f"{MAX_ENV}")
    kind, values = pool.reservation or (None, ())
    if kind == "SPECIFIC_RESERVATION" and any("/reservations/" not in value for value in values):
        raise ConfigError(source, f"{pool.name}: a specific reservation is named by its full resource name "
                              "(projects/P/zones/Z/reservations/NAME)")


def validate(job: JobSpec, source: str, framework: str | None) -> list[str]:
    """Raise ConfigError for an invalid job; return warnings for a valid but unwise one."""
    _check_layout(job, source)
    chief = job.pool(0)
    assert chief is not None
    warnings: list[str] = []
    for pool in job.present():
        warnings += machines.check_machine_type(f"{source}: {pool.name}", pool.machine_type)
        if not (pool.index == 2 and network.is_reduction_server(pool.image_uri)):
            machines.check_accelerator(f"{source}: {pool.name}", pool.machine_type, pool.accelerator)
            _check_pool(pool, source)
        if pool.image_uri == chief.image_uri:
            warnings += _check_image_gpus(pool, source, framework)
        if pool.reservation and pool.reservation[0] == "SPECIFIC_RESERVATION" and job.settings.strategy in (
                "SPOT", "FLEX_START"):
            raise ConfigError(source, f"{pool.name}: {job.settings.strategy} VMs cannot consume a reservation")
    if job.settings.strategy == "FLEX_START":
        _check_flex_start(job, source)
    servers = job.pool(2)
    if servers is not None and network.is_reduction_server(servers.image_uri):
        warnings += _check_reducers(job, source)
    planned.check_vertex(job, source, framework)
    evaluators = job.pool(3)
    if evaluators is not None and evaluators.replicas > 1:
        serving = " / ".join(f.label for f in registry.serving("evaluator")) or "the framework"
        warnings.append(f"{evaluators.replicas} evaluators: {serving} expects a single evaluator")
    return warnings
