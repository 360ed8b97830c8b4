"""``entrypoint doctor``: checks of this node against the plan, one line each; ``run`` runs the cheap ones first.

``report`` prints every check (``--json``: one object) and exits non-zero only for what will certainly fail,
with that failure's exit code (docs/EXIT_CODES.md). ``preflight`` runs before any framework is imported:
it logs warnings and errors only, ends the run on an error, and caps ``--data-workers`` to what /dev/shm
holds instead of letting workers die with "Bus error". Nothing here imports an ML framework.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
from dataclasses import dataclass, replace

from entrypoint.cluster.environments.settings import PlatformSettings
from entrypoint.doctor import checks
from entrypoint.doctor.checks import Finding
from entrypoint.doctor.facts import NodeFacts, checkpoint_bytes, host_of, node_facts, path_facts, resolvable
from entrypoint.errors import TrainerError
from entrypoint.planning import registry
from entrypoint.planning.plan import Plan

log = logging.getLogger("entrypoint")


class PreflightError(TrainerError):
    """A check found what will certainly fail: the run ends before any framework starts."""

    def __init__(self, finding: Finding) -> None:
        self.failure = finding.failure
        super().__init__(f"doctor: {finding.text()}")


@dataclass(frozen=True)
class Demand:
    """What this node's processes will ask of it."""

    workers: int  # DataLoader workers per process
    cappable: bool  # the loop is ours: run can lower --data-workers
    nccl: bool  # NCCL between GPUs
    nccl_shm: bool  # ... with several GPUs on this node (NCCL's shared-memory segments)
    gloo: bool  # gloo between processes (torch.distributed on CPU)
    usable_gpus: int


def demand(plan: Plan, node: NodeFacts) -> Demand:
    """DataLoader workers, collectives and GPUs of this node's part of the plan (the framework's record says
    which DataLoader workers its loop starts, what a script of it is assumed to start, and its CPU backend)."""
    usable = checks.usable_gpus(plan.gpus_per_node, node.driver_gpus) if node.image_cuda else 0
    hooks = plan.code is not None and plan.code.kind == "hooks"
    chosen = plan.options.data_workers
    framework = registry.get(plan.framework)
    loader = framework.data_loader
    workers, cappable = 0, False
    if loader is not None and hooks:
        workers, cappable = (chosen if chosen is not None else plan.loader_workers(bool(usable))), True
    elif loader is not None:
        workers = chosen if chosen is not None else loader.script
    distributed = plan.world_size > 1
    nccl = bool(usable) and (distributed or usable > 1)
    return Demand(workers=workers, cappable=cappable, nccl=nccl,
                  nccl_shm=nccl and (plan.nproc_per_node > 1 or usable > 1),
                  gloo=distributed and not usable and framework.cpu_collectives == "gloo", usable_gpus=usable)


def run_checks(plan: Plan, settings: PlatformSettings, cheap: bool) -> tuple[list[Finding], int | None]:
    """Every check (``cheap``: all but the DNS look-ups), and the capped worker count if /dev/shm needs one."""
    node = node_facts(settings)
    need = demand(plan, node)
    shm, cap = checks.shm(node.shm, plan.nproc_per_node, need.workers, need.cappable, need.nccl_shm)
    found = [
        shm,
        checks.driver(node.driver, node.image_cuda, node.forward_compat, node.driver_gpus),
        checks.gpus(plan.framework, plan.nproc_per_node, plan.gpus_per_node, node.driver_gpus, node.image_cuda,
                    forced=plan.options.nproc_per_node is not None),
        checks.cpus(settings.cpus, node.cpus),
        checks.interfaces(settings.nccl_socket_ifname, settings.gloo_socket_ifname, node.interfaces, need.nccl,
                          need.gloo),
        checks.nofile(node.nofile, need.workers),
        checks.memlock(node.memlock, need.nccl),
        checks.image(plan.image),
        checks.peer_snapshots(_peer_snapshots(plan), node.host_memory, plan.world_size, plan.nproc_per_node),
    ]
    outs, chief = plan.outputs, plan.topology.is_chief_node
    places = [("job dir", outs.job_dir)]
    if chief:
        places += [("model dir", outs.model_dir), ("checkpoint dir", outs.checkpoint_dir),
                   ("tensorboard dir", outs.tensorboard_dir)]
    found.append(checks.outputs([(name, path_facts(where)) for name, where in places], chief))
    if chief:
        where = path_facts(outs.checkpoint_dir)
        found.append(checks.disk(where.free, checkpoint_bytes(outs.checkpoint_dir), outs.checkpoint_dir))
    else:
        found.append(Finding("disk", "skipped", "the chief writes the checkpoints"))
    if not cheap:  # run refuses a framework it lacks itself, before these (cli.py)
        found.insert(0, framework_check(plan))
        hosts = [host_of(p.address) for p in plan.topology.training_peers() if p.address]
        found.append(checks.peers(resolvable(hosts)))
        found += fabric_checks(plan, settings)  # run logs the fabric step itself (lifecycle/runner.py)
    return found, cap


def _peer_snapshots(plan: Plan) -> str | None:
    """Whether the plan's framework keeps FSDP's snapshots in peer memory (its record says)."""
    decide = registry.get(plan.framework).peer_snapshots
    return decide(plan) if decide is not None else None


def framework_check(plan: Plan) -> Finding:
    """The plan's framework in this Python, with the version of its installed distribution where one is known."""
    chosen = registry.get(plan.framework)
    version = None
    if chosen.installed():
        version = ""
        top = chosen.probe.split(".")[0]
        for dist in (top, f"{top}-cpu"):  # the distribution named after its module (tensorflow-cpu's is tensorflow)
            try:
                version = f"({dist} {importlib.metadata.version(dist)})"
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    script = plan.code is not None and plan.code.kind == "script"
    return checks.framework(chosen.name, version, registry.installed_here(), registry.where_installed(chosen), script)


def fabric_checks(plan: Plan, settings: PlatformSettings) -> list[Finding]:
    """The GPU fabric's checks (doctor/fabric.py) on the fabric step ``run`` would take here."""
    from entrypoint.cluster.fabric import mode_of
    from entrypoint.doctor import fabric

    mode = mode_of(plan.options.fabric, settings.fabric)
    return fabric.findings(fabric.facts(mode, os.environ, settings.fabric_root, load=True))


def exit_code(found: list[Finding]) -> int:
    """0, or the exit code of the first error (what ``run`` would end with)."""
    return next((int(f.failure.exit_code) for f in found if f.status == "error"), 0)


def report(plan: Plan, settings: PlatformSettings, as_json: bool) -> int:
    """``doctor``: print every check, one line each (or one JSON object); non-zero only for an error."""
    found, _cap = run_checks(plan, settings, cheap=False)
    code = exit_code(found)
    if as_json:
        print(json.dumps({"checks": [f.to_dict() for f in found], "exit_code": code}, indent=2))
    else:
        for finding in found:
            print(finding.line(), flush=True)
    return code


def preflight(plan: Plan, settings: PlatformSettings) -> Plan:
    """``run``'s cheap checks: log warnings and errors, end on an error, cap --data-workers to /dev/shm."""
    found, cap = run_checks(plan, settings, cheap=True)
    failed = [f for f in found if f.status == "error"]
    for finding in found:
        if finding.status == "warning" or (finding.status == "error" and finding is not failed[0]):
            log.log(logging.WARNING if finding.status == "warning" else logging.ERROR, "doctor: %s", finding.text())
    if failed:
        raise PreflightError(failed[0])
    if cap is not None:
        plan = replace(plan, options=replace(plan.options, data_workers=cap))
    return plan
