"""Run the PyTorch part of this node: in this process for one process per node, torch's elastic agent for more.

Either way the node plays torchrun: its processes see the variables torchrun sets (``process_env``),
with the same values, and the job's store is the launcher's (``store.py``), hosted on node 0 before
any process starts and kept up until every node is done (the exit barrier); a peer node restarted while the
nodes' processes run ends node 0's attempt at once when nodes restart together (``restarts.py``). One process per node
(CPU, one GPU, ``--nproc-per-node 1``): no agent and no second interpreter; this process becomes the
worker, so signals, exit codes, failure records and the rendezvous timeout are its own. Several
processes per node: torch's elastic launcher (the engine behind ``torchrun``) over that store, each
worker being ``python -m entrypoint.worker`` (forked from the node's fork server, ``forkserver.py``, started first so
that its import of torch overlaps the agent's own and the rendezvous; exec'd without one), stopped with an explicit
grace period on SIGTERM.
Processes the platform placed itself (under its own torchrun) run as they are. A node of several processes adopts
what they leave behind (a child subreaper): a process of a rank still running when its rank is gone (a DataLoader
worker that never started, holding the job's output open) is killed before the node exits with its ranks' cause.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from entrypoint import failures
from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments.settings import read_settings
from entrypoint.errors import ExitCode, exit_code_of, signal_exit_code
from entrypoint.lifecycle.runner import run_process
from entrypoint.lifecycle.startup.ports import free_ports
from entrypoint.planning.plan import Plan
from entrypoint.pytorch.launch import forkserver
from entrypoint.pytorch.launch.store import BACKEND, NodeStore, job_run_id, node_store, register_backend

log = logging.getLogger("entrypoint.pytorch")
ROLE = "default"  # torchrun's role name
MAX_RESTARTS = 0  # the agent never restarts workers itself: the platform restarts the replica
SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # what torchrun's agent sets for its workers


def rendezvous_address(plan: Plan) -> tuple[str, int]:
    """The chief's address from the cluster spec, else a free port on this machine (a single node)."""
    return plan.topology.chief_host_port() or ("127.0.0.1", free_ports(1)[0])


def run_id(plan: Plan, host: str, port: int) -> str:
    """The rendezvous id every node derives alike (torchrun's ``--rdzv-id``)."""
    return job_run_id(host, port, plan.topology.trial)


def process_env(plan: Plan, host: str, port: int, error_file: str) -> dict[str, str]:
    """Every variable torchrun sets for a process placed by ``plan.for_process``, with torchrun's values."""
    topo, process = plan.topology, plan.placed
    return {
        ev.RANK: str(process.training_rank), ev.WORLD_SIZE: str(process.world_size),
        ev.LOCAL_RANK: str(process.local_rank), ev.LOCAL_WORLD_SIZE: str(process.local_world_size),
        ev.GROUP_RANK: str(topo.node_rank or 0), ev.GROUP_WORLD_SIZE: str(topo.num_nodes),
        ev.ROLE_NAME: ROLE, ev.ROLE_RANK: str(process.training_rank), ev.ROLE_WORLD_SIZE: str(process.world_size),
        ev.MASTER_ADDR: host, ev.MASTER_PORT: str(port),
        ev.TORCHELASTIC_RESTART_COUNT: str(plan.restart_count), ev.TORCHELASTIC_MAX_RESTARTS: str(MAX_RESTARTS),
        ev.TORCHELASTIC_RUN_ID: run_id(plan, host, port), ev.TORCHELASTIC_USE_AGENT_STORE: str(True),
        ev.TORCHELASTIC_SIGNALS_TO_HANDLE: SIGNALS_TO_HANDLE, ev.TORCHELASTIC_ERROR_FILE: error_file,
    }


def launch(plan: Plan, ctx: failures.FailureContext) -> int:
    """Run this node's processes; the exit code of the node."""
    topo = plan.topology
    if topo.processes_started_externally:  # torchrun started this process: it is placed already
        return run_process(plan, ctx)
    if plan.nproc_per_node == 1:
        return _node(plan, ctx, None)
    with _fork_server() as server:  # started first: its imports overlap the agent's own and the rendezvous
        _import_quietly()
        return _node(plan, ctx, server)


def _node(plan: Plan, ctx: failures.FailureContext, server: forkserver.Server | None) -> int:
    topo = plan.topology
    host, port = rendezvous_address(plan)
    from entrypoint.pytorch.launch import membership, restarts

    with node_store(host, port, topo.node_rank or 0, topo.num_nodes, plan.options.timeout,
                    run_id(plan, host, port), topo.training_peers(), membership.applies(plan)) as store:
        with restarts.watched(plan, store, ctx):  # node 0: a peer node restarted meanwhile ends this attempt
            code = _in_process(plan, store, ctx) if plan.nproc_per_node == 1 else _elastic(plan, store, server)
        if code == ExitCode.OK:
            store.leave_together()
    return code


@contextlib.contextmanager
def _error_file() -> Iterator[str]:
    """Where torch's ``record`` writes a failure, as under torchrun (a private directory, removed after)."""
    directory = tempfile.mkdtemp(prefix="trainer-torchelastic-")
    try:
        yield os.path.join(directory, "error.json")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _in_process(plan: Plan, store: NodeStore, ctx: failures.FailureContext) -> int:
    from entrypoint.pytorch.launch import nodewatch

    topo, placed = plan.topology, plan.for_process(0)
    with _error_file() as error_file:
        os.environ.update(process_env(placed, store.host, store.port, error_file))
        log.info("node %s/%s: training in this process, world size %d (%s)", topo.node_rank, topo.num_nodes,
                 plan.world_size, plan.reason)
        with nodewatch.watched(plan, store, ctx):  # a script's lost peer is named (the hooks loop names its own)
            return run_process(placed, ctx)


@contextlib.contextmanager
def _fork_server() -> Iterator[forkserver.Server | None]:
    """The node's fork server for its ranks (``forkserver.py``), unless turned off (``TRAINER_FORK_SERVER=0``)."""
    if not read_settings().fork_server or not sys.platform.startswith("linux"):
        yield None
        return
    with forkserver.started(dict(os.environ)) as server:
        yield server


def _import_quietly() -> None:
    """Import torch's launcher with its C++ log level at FATAL for this agent process only.

    c10d's retry stack dumps would bury our own one-line messages; workers keep the user's level.
    """
    previous = os.environ.get(ev.TORCH_CPP_LOG_LEVEL)
    os.environ.setdefault(ev.TORCH_CPP_LOG_LEVEL, "FATAL")
    import torch.distributed.launcher.api  # noqa: F401

    if previous is None:
        del os.environ[ev.TORCH_CPP_LOG_LEVEL]


def _elastic(plan: Plan, store: NodeStore, server: forkserver.Server | None) -> int:
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    topo, options = plan.topology, plan.options
    register_backend()
    config = LaunchConfig(
        min_nodes=topo.num_nodes, max_nodes=topo.num_nodes, nproc_per_node=plan.nproc_per_node,
        run_id=store.run_id, role=ROLE, rdzv_endpoint=f"{store.host}:{store.port}", rdzv_backend=BACKEND,
        max_restarts=MAX_RESTARTS, monitor_interval=0.2, start_method="spawn",
        logs_specs=DefaultLogsSpecs(redirects=Std.NONE, tee=Std.NONE), log_line_prefix_template=None,
        shutdown_timeout=int(options.grace_period),
    )
    log.info("node %s/%s: starting %d processes%s, world size %d, rendezvous %s:%d (%s)", topo.node_rank,
             topo.num_nodes, plan.nproc_per_node, " forked from a fork server" if server else "", plan.world_size,
             store.host, store.port, plan.reason)
    command = server.command("entrypoint.worker") if server else ("-m", "entrypoint.worker")
    try:
        with adopting_leftovers(keep=[server.proc.pid] if server else []):
            elastic_launch(config, sys.executable)(*command)
    except ChildFailedError as exc:
        _rank, failure = exc.get_first_failure()
        return exit_code_of(failure.exitcode)
    except SignalException as exc:
        return signal_exit_code(exc.sigval)
    return ExitCode.OK


_PR_SET_CHILD_SUBREAPER = 36
LEFTOVER_GRACE = 5.0  # seconds a process a rank left behind has to end by itself before it is killed


@contextlib.contextmanager
def adopting_leftovers(keep: list[int] | None = None) -> Iterator[None]:
    """While the ranks run, this process adopts their orphans (Linux); when they are done, every process left but
    ``keep`` (the fork server, ended after) is killed: nothing of a rank outlives it (its pipes would hold the job's
    output open) and the node ends with them."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield
    finally:
        deadline = time.monotonic() + LEFTOVER_GRACE
        while (left := [pid for pid in leftovers() if pid not in (keep or []) and not _reaped(pid)]) and \
                time.monotonic() < deadline:
            time.sleep(0.05)  # what ends with its rank (a DataLoader's fork server, its workers) ends by itself
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                log.warning("killed process %d a rank left behind", pid)
                os.waitpid(pid, 0)


def _reaped(pid: int) -> bool:
    """Whether the child ``pid`` has ended (and is reaped now)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return True


def leftovers() -> list[int]:
    """This process's children but multiprocessing's resource tracker (its own, not a rank's)."""
    from multiprocessing import resource_tracker

    keep = getattr(getattr(resource_tracker, "_resource_tracker", None), "_pid", None)
    pids: list[int] = []
    for task in Path(f"/proc/{os.getpid()}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            pids.extend(int(pid) for pid in (task / "children").read_text().split())
    return [pid for pid in pids if pid != keep]
