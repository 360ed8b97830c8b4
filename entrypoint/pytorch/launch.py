"""Run the PyTorch part of this node: in this process for one process per node, torch's elastic agent for more.

One process per node (CPU, one GPU, ``--nproc-per-node 1``, or processes the platform placed itself):
no agent and no second interpreter; this process sets torchrun's variables and becomes the worker,
so signals, exit codes, failure records and the rendezvous timeout are its own. Several processes
per node: torch's elastic launcher (the engine behind ``torchrun``) with the static rendezvous at
the chief's address, each worker being ``python -m entrypoint.worker``, stopped with an explicit
grace period (``--grace-period``) on SIGTERM.
"""

from __future__ import annotations

import logging
import os
import sys

from entrypoint import envvars as ev
from entrypoint import failures
from entrypoint.errors import ExitCode
from entrypoint.plan import Plan
from entrypoint.runner import run_process
from entrypoint.supervisor import free_ports

log = logging.getLogger("entrypoint.pytorch")


def rendezvous_address(plan: Plan) -> tuple[str, int]:
    """The chief's address from the cluster spec, else a free port on this machine (a single node)."""
    return plan.topology.chief_host_port() or ("127.0.0.1", free_ports(1)[0])


def process_env(plan: Plan, host: str, port: int) -> dict[str, str]:
    """torchrun's variables for a process placed by ``plan.for_process`` (what ``env://`` reads)."""
    topo = plan.topology
    assert topo.process is not None
    return {
        ev.RANK: str(topo.process.rank), ev.WORLD_SIZE: str(topo.process.world_size),
        ev.LOCAL_RANK: str(topo.process.local_rank), ev.LOCAL_WORLD_SIZE: str(topo.process.local_world_size),
        ev.GROUP_RANK: str(topo.node_rank or 0), ev.GROUP_WORLD_SIZE: str(topo.num_nodes),
        ev.MASTER_ADDR: host, ev.MASTER_PORT: str(port),
    }


def launch(plan: Plan) -> int:
    """Run this node's processes; the exit code of the node."""
    topo = plan.topology
    if topo.per_process:
        return run_process(plan, failures.active())
    if plan.nproc_per_node == 1:
        placed = plan.for_process(0)
        os.environ.update(process_env(placed, *rendezvous_address(plan)))
        log.info("node %s/%s: training in this process, world size %d (%s)", topo.node_rank, topo.num_nodes,
                 plan.world_size, plan.reason)
        return run_process(placed, failures.active())
    return _elastic(plan)


def _import_quietly() -> None:
    """Import torch's launcher with its C++ log level at FATAL for this agent process only.

    c10d's retry stack dumps would bury our own one-line messages; workers keep the user's level.
    """
    previous = os.environ.get(ev.TORCH_CPP_LOG_LEVEL)
    os.environ.setdefault(ev.TORCH_CPP_LOG_LEVEL, "FATAL")
    import torch.distributed.launcher.api  # noqa: F401

    if previous is None:
        del os.environ[ev.TORCH_CPP_LOG_LEVEL]


def _elastic(plan: Plan) -> int:
    _import_quietly()
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    topo, options = plan.topology, plan.options
    host, port = rendezvous_address(plan)
    config = LaunchConfig(
        min_nodes=topo.num_nodes, max_nodes=topo.num_nodes, nproc_per_node=plan.nproc_per_node,
        run_id=f"trainer-{host}-{port}-{topo.trial or 'job'}", role="trainer", rdzv_endpoint=f"{host}:{port}",
        rdzv_backend="static", rdzv_configs={"rank": topo.node_rank, "timeout": int(options.timeout)},
        max_restarts=0, monitor_interval=0.2, start_method="spawn",
        logs_specs=DefaultLogsSpecs(redirects=Std.NONE, tee=Std.NONE), log_line_prefix_template=None,
        shutdown_timeout=int(options.grace_period),
    )
    log.info("node %s/%s: starting %d processes, world size %d, rendezvous %s:%d (%s)", topo.node_rank,
             topo.num_nodes, plan.nproc_per_node, plan.world_size, host, port, plan.reason)
    try:
        elastic_launch(config, sys.executable)("-m", "entrypoint.worker")
    except ChildFailedError as exc:
        _rank, failure = exc.get_first_failure()
        return 128 - failure.exitcode if failure.exitcode < 0 else failure.exitcode
    except SignalException as exc:
        return 128 + int(exc.sigval)
    return ExitCode.OK
