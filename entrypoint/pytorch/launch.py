"""Start one process per GPU (or --nproc-per-node) on this node through torch's elastic launcher.

torch's own engine (the one behind ``torchrun``) is called as a library with the static
rendezvous: node 0 hosts the store at the chief's address, every node joins with its node rank.
Where processes are already one per GPU (torchrun, Kubeflow, mpirun) nothing is spawned again.
"""

from __future__ import annotations

import logging
import os
import sys

from entrypoint.environments import read_settings
from entrypoint.errors import ExitCode, RetryableError
from entrypoint.options import RunOptions
from entrypoint.plan import Plan
from entrypoint.progress import setup_logging
from entrypoint.pytorch.worker import encode_options
from entrypoint.supervisor import free_ports
from entrypoint.topology import ClusterTopology
from entrypoint.usercode import is_hooks_module, require_code

log = logging.getLogger("entrypoint.pytorch")
_CPP_LOG_LEVEL = "TORCH_CPP_LOG_LEVEL"


def worker_command(
    options: RunOptions, kind: str, target: str, worker_module: str = "entrypoint.pytorch.worker"
) -> list[str]:
    """Arguments after ``python`` for each worker: our hooks loop, or the user's code unchanged."""
    if kind == "module" and is_hooks_module(target):
        return ["-m", worker_module, encode_options(options, target)]
    if kind == "module":
        return ["-m", target, *options.user_args]
    return [target, *options.user_args]


def missing_peers(topo: ClusterTopology) -> str:
    """Human names of the nodes this one waited for."""
    if topo.node_rank != 0:
        name = "workerpool0[0]" if topo.source == "vertex" else "node rank 0"
        return f"the chief {name} ({topo.chief_address})"
    if topo.workers:
        pool = "workerpool1" if topo.source == "vertex" else "worker"
        names = [f"{pool}[{i}] ({addr})" for i, addr in enumerate(topo.workers)]
        return "one or more of " + ", ".join(names) if len(names) > 1 else names[0]
    ranks = ", ".join(str(r) for r in range(1, topo.num_nodes))
    return f"node rank(s) {ranks}"


def _import_quietly() -> None:
    """Import torch with its C++ log level at FATAL for this (agent) process only.

    A rendezvous timeout is reported once, as one line; c10d's retry stack dumps would bury it.
    The workers inherit the user's own TORCH_CPP_LOG_LEVEL (or none).
    """
    previous = os.environ.get(_CPP_LOG_LEVEL)
    os.environ.setdefault(_CPP_LOG_LEVEL, "FATAL")
    import torch.distributed.launcher.api  # noqa: F401

    if previous is None:
        del os.environ[_CPP_LOG_LEVEL]


def _elastic(plan: Plan, options: RunOptions, command: list[str]) -> int:
    _import_quietly()
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    topo = plan.topology
    host, port = topo.chief_host_port() if topo.chief_address else ("127.0.0.1", free_ports(1)[0])
    run_id = f"trainer-{host}-{port}-{topo.trial or 'job'}"
    config = LaunchConfig(
        min_nodes=topo.num_nodes,
        max_nodes=topo.num_nodes,
        nproc_per_node=plan.nproc_per_node,
        run_id=run_id,
        role="trainer",
        rdzv_endpoint=f"{host}:{port}",
        rdzv_backend="static",
        rdzv_configs={"rank": topo.node_rank, "timeout": int(options.timeout)},
        max_restarts=0,
        monitor_interval=0.2,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(redirects=Std.NONE, tee=Std.NONE),
        log_line_prefix_template=None,
    )
    log.info("node %s/%s: starting %d process(es) per node, world size %d, rendezvous %s:%d (%s)",
             topo.node_rank, topo.num_nodes, plan.nproc_per_node, plan.world_size, host, port, plan.reason)
    try:
        elastic_launch(config, sys.executable)(*command)
    except ChildFailedError as exc:
        _rank, failure = exc.get_first_failure()
        code = failure.exitcode
        return 128 - code if code < 0 else code  # a signal: 128 + its number
    except SignalException as exc:
        return 128 + int(exc.sigval)
    except Exception as exc:
        name = type(exc).__name__
        if "Store" in name or "Rendezvous" in name or "Timeout" in name or "timed out" in str(exc).lower():
            raise RetryableError(
                f"rendezvous at {host}:{port} failed after {int(options.timeout)}s: {missing_peers(topo)} never came "
                f"({name})"
            ) from None
        raise
    return ExitCode.OK


def launch(plan: Plan, options: RunOptions) -> int:
    """Run the user's code on this node with the right processes and variables."""
    setup_logging()
    kind, target = require_code(options, read_settings().module)
    command = worker_command(options, kind, target)
    os.environ.update(plan.emitted_env())  # children inherit the resolved dirs, trial and rendezvous
    if plan.topology.per_process:
        if command[:2] == ["-m", "entrypoint.pytorch.worker"]:
            from entrypoint.pytorch.worker import main as worker_main

            return worker_main([command[2]])
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, *command])
    return _elastic(plan, options, command)
