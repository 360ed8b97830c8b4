"""``job vertex``: the CustomJob for one of our images, from the same counts ``local`` takes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from entrypoint.errors import ConfigError
from entrypoint.jobs import machines, network, planned
from entrypoint.jobs.args import framework_args, infer_framework, run_options, with_run_option
from entrypoint.jobs.images import parse_image
from entrypoint.jobs.model import JobSettings, JobSpec, PoolSpec
from entrypoint.jobs.vertex.pools import EvaluatorMachines, PoolExtras
from entrypoint.jobs.vertex.rules import validate
from entrypoint.planning import registry

DEFAULT_MACHINE = "n1-standard-4"
DEFAULT_REGION = "us-central1"


@dataclass(frozen=True)
class VertexRequest:
    """What ``job vertex`` was asked for."""

    image: str
    run_args: tuple[str, ...]
    framework: str | None = None
    workers: int = 1
    machine_type: str = DEFAULT_MACHINE
    accelerator: str | None = None
    ps: int = 0
    ps_machine_type: str | None = None
    ps_disk: tuple[str | None, int | None] = (None, None)  # --ps-boot-disk-type, --ps-boot-disk-size
    evaluators: int = 0
    reduction_servers: str | None = None
    reduction_server_machine_type: str = network.DEFAULT_REDUCER_MACHINE
    display_name: str | None = None
    base_output_dir: str | None = None
    region: str = DEFAULT_REGION
    settings: JobSettings = field(default_factory=JobSettings)
    extras: PoolExtras = field(default_factory=PoolExtras)
    evaluator: EvaluatorMachines = field(default_factory=EvaluatorMachines)


def parse_accelerator(text: str | None, machine_type: str, flag: str = "--accelerator") -> tuple[str, int] | None:
    """``TYPE:COUNT``; without it, the GPUs an accelerator-optimized machine type comes with."""
    if text is None:
        return machines.implied_accelerator(machine_type)
    kind, sep, count = text.partition(":")
    if not sep or not count.isdigit():
        raise ConfigError(flag, "expected TYPE:COUNT, e.g. NVIDIA_TESLA_T4:1")
    return machines.accelerator_name(kind.strip(), flag), int(count)


def default_display_name(image: str) -> str:
    """The image's name without registry, tag or digest (``pytorch`` for ``.../pytorch:v1``)."""
    return parse_image(image).name or "trainer"


def reducer_count(req: VertexRequest, accelerator: tuple[str, int] | None) -> tuple[int, str | None]:
    """``--reduction-servers N|auto``: the count, and how ``auto`` got it."""
    text = req.reduction_servers or ""
    if text.isdigit() and int(text) >= 1:
        return int(text), None
    if text != "auto":
        raise ConfigError("--reduction-servers", "expected a count >= 1 or 'auto'")
    per_vm = network.training_bandwidth(req.machine_type, accelerator)
    if per_vm is None:
        raise ConfigError("--reduction-servers", f"auto: no documented bandwidth for {req.machine_type}"
                          f"{' with ' + accelerator[0] if accelerator else ''}; pass a count "
                          f"(see {network.BANDWIDTH_SOURCE})")
    per_reducer = network.reducer_bandwidth(req.reduction_server_machine_type)
    if per_reducer is None:
        raise ConfigError("--reduction-server-machine-type", "auto: only N1/N2 reducers (n1-highcpu-16) are "
                          "sized; pass a count")
    count = network.reducers_needed(req.workers, per_vm, per_reducer)
    total = network.GPU_MACHINE_BANDWIDTH.get(req.machine_type, (per_vm, per_vm))[0]
    nics = f" (of {total}: the GPU-to-GPU NICs do not reach reducers)" if total != per_vm else ""
    how = (f"--reduction-servers auto: {req.workers} training VMs x {per_vm} Gbps general-purpose network{nics} / "
           f"{per_reducer} Gbps per {req.reduction_server_machine_type} -> {count} reducers")
    return count, how


def _check_counts(req: VertexRequest) -> None:
    if req.workers < 1:
        raise ConfigError("--workers", "counts training replicas (chief + workers), so it must be >= 1; "
                          "workerpool0 always has exactly one")
    if req.ps < 0 or req.evaluators < 0:
        raise ConfigError("--ps/--evaluators", "must be >= 0")
    if req.ps and req.reduction_servers:
        raise ConfigError("--reduction-servers", "a Reduction Server cannot serve ParameterServerStrategy: "
                          "workerpool2 is either --ps or --reduction-servers")
    if req.ps == 0 and req.ps_disk != (None, None):
        raise ConfigError("--ps-boot-disk-type/--ps-boot-disk-size", "are the parameter servers' disks: give --ps")
    if req.evaluators == 0 and req.evaluator != EvaluatorMachines():
        raise ConfigError("--evaluator-machine-type/--evaluator-accelerator/--evaluator-boot-disk-*",
                          "are the evaluators' machines: give --evaluators")
    if req.base_output_dir is not None and not req.base_output_dir.startswith("gs://"):
        raise ConfigError("--base-output-dir", "must be a Cloud Storage URI (gs://bucket/path)")


def _pools(req: VertexRequest, accelerator: tuple[str, int] | None,
           args: tuple[str, ...]) -> tuple[list[PoolSpec | None], list[str]]:
    notes: list[str] = []
    x, ev = req.extras, req.evaluator

    def ours(index: int, replicas: int, machine: str, acc: tuple[str, int] | None, disk: str | None = None,
             size: int | None = None) -> PoolSpec | None:
        if replicas <= 0:
            return None
        same = (machine, acc) == (req.machine_type, accelerator)
        reservation = x.reservation if same else None  # a reservation holds one machine configuration
        implied = machines.default_boot_disk(machine)
        if not (disk or x.disk_type) and implied:
            note = f"{machine} boots from {implied} only: its pools' diskSpec.bootDiskType says so"
            notes.extend([note] if note not in notes else [])
        return PoolSpec(index, replicas, machine, req.image, acc, args, env=x.env,
                        disk_type=disk or x.disk_type or implied,
                        disk_size_gb=size or x.disk_size_gb, reservation=reservation, nfs_mounts=x.nfs_mounts,
                        lustre_mounts=x.lustre_mounts)

    pools = [ours(0, 1, req.machine_type, accelerator), ours(1, req.workers - 1, req.machine_type, accelerator)]
    if req.reduction_servers:
        count, how = reducer_count(req, accelerator)
        notes += [how] if how else []
        pools.append(PoolSpec(2, count, req.reduction_server_machine_type,
                              network.reduction_server_image(req.region)))
    else:
        ps_machine = req.ps_machine_type or req.machine_type
        pools.append(ours(2, req.ps, ps_machine, machines.implied_accelerator(ps_machine), *req.ps_disk))
    eval_machine = ev.machine_type or req.machine_type
    eval_acc = parse_accelerator(ev.accelerator, eval_machine, "--evaluator-accelerator") \
        if ev.machine_type or ev.accelerator else accelerator
    pools.append(ours(3, req.evaluators, eval_machine, eval_acc, ev.disk_type, ev.disk_size_gb))
    while pools and pools[-1] is None:
        pools.pop()
    return pools, notes


def build(req: VertexRequest) -> tuple[JobSpec, list[str], list[str]]:
    """The job, notes and warnings for stderr; ConfigError when the combination is invalid."""
    _check_counts(req)
    options = run_options(req.run_args, "job vertex")
    framework = infer_framework(req.framework, req.image, options.framework)
    if framework is None:
        raise ConfigError("--framework", f"not given, not in the run args, and not the image's name; pass "
                          f"--framework {'|'.join(registry.names())}")
    accelerator = parse_accelerator(req.accelerator, req.machine_type)
    if req.display_name is not None and not req.display_name.strip():
        raise ConfigError("--display-name", "is empty: a CustomJob's displayName is required (leave the option out "
                          "for the image's name)")
    name = req.display_name or default_display_name(req.image)
    if len(name) > 128:
        raise ConfigError("--display-name", "at most 128 characters")
    run_args, notes = framework_args(req.run_args, req.image, req.framework, options.framework)
    req = replace(req, run_args=run_args)
    pools, more = _pools(req, accelerator, req.run_args)
    notes += more
    job = JobSpec(name, tuple(pools), req.base_output_dir, req.settings)
    pin = _reducer_pin(job, framework, options.strategy)
    if pin is not None:
        pools, _ = _pools(req, accelerator, with_run_option(req.run_args, "--strategy", pin))
        job = JobSpec(name, tuple(pools), req.base_output_dir, req.settings)
        notes.append(f"{registry.get(framework).label} with a Reduction Server: the args pin --strategy {pin} "
                     "(at run time workerpool2 would otherwise read as parameter servers)")
    return job, notes, validate(job, "job vertex", framework)


def _reducer_pin(job: JobSpec, framework: str, forced: str | None) -> str | None:
    """The strategy to pin when, without one, the chief would read the Reduction Server pool as parameter servers."""
    servers, chief = job.pool(2), job.pool(0)
    if servers is None or chief is None or forced is not None or not network.is_reduction_server(servers.image_uri):
        return None
    replica = planned.vertex_replicas(job)[0]
    if planned.plan_replica(replica, framework, "job vertex").server_pool == "reduction_server":
        return None
    return planned.reducer_strategy(replica, framework, "job vertex")
