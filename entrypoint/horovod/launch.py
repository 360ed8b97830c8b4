"""Launch Horovod without ssh: each replica starts its own local processes, which meet through Horovod's
own gloo rendezvous server hosted by the chief, the way Horovod's Ray and Spark integrations start
workers (rank, size, local and cross ranks derived from the topology).

The peers already met at the start-up barrier, so the rendezvous only hands out the slot plan. When
``mpirun`` / ``horovodrun`` already started this process (OMPI_* / HOROVOD_* set), that is used.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
import threading
from typing import Any

from entrypoint import failures
from entrypoint.cluster import envvars as ev
from entrypoint.cluster.placement import Placement, job_world_size, place
from entrypoint.cluster.topology import ClusterTopology
from entrypoint.lifecycle.runner import run_process
from entrypoint.lifecycle.startup.ports import free_ports
from entrypoint.lifecycle.supervision.supervisor import Replica, run_replicas
from entrypoint.outputs import logs
from entrypoint.planning.plan import Plan

log = logging.getLogger("entrypoint.horovod")


def node_name(node_rank: int) -> str:
    """The Horovod host name of a node (unique per node, also when every node is 127.0.0.1)."""
    return f"node{node_rank}"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def start_rendezvous(topo: ClusterTopology, nproc: int, port: int) -> Any:
    """Horovod's own HTTP rendezvous server on the chief's port, initialised with the slot plan."""
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    hosts = [HostInfo(node_name(i), nproc) for i in range(topo.num_nodes)]
    server = RendezvousHTTPServer(("", port), RendezvousHandler, 0)
    server.init(get_host_assignments(hosts, job_world_size(topo, nproc)))
    threading.Thread(target=server.serve_forever, name="horovod-rendezvous", daemon=True).start()
    return server


def worker_env(topo: ClusterTopology, placed: Placement, host: str, port: int, timeout: float) -> dict[str, str]:
    """The HOROVOD_* variables horovodrun would give the process ``placed`` on this node."""
    node = placed.node_rank or 0
    env = {
        ev.HOROVOD_RANK: str(placed.training_rank),
        ev.HOROVOD_SIZE: str(placed.world_size),
        ev.HOROVOD_LOCAL_RANK: str(placed.local_rank),
        ev.HOROVOD_LOCAL_SIZE: str(placed.local_world_size),
        ev.HOROVOD_CROSS_RANK: str(node),
        ev.HOROVOD_CROSS_SIZE: str(topo.num_nodes),
        ev.HOROVOD_HOSTNAME: node_name(node),
        ev.HOROVOD_CONTROLLER: "gloo",
        ev.HOROVOD_CPU_OPERATIONS: "gloo",
        ev.HOROVOD_GLOO_RENDEZVOUS_ADDR: host,
        ev.HOROVOD_GLOO_RENDEZVOUS_PORT: str(port),
        ev.HOROVOD_GLOO_TIMEOUT_SECONDS: str(int(timeout)),
    }
    if _is_loopback(host):
        env[ev.HOROVOD_GLOO_IFACE] = "lo"
    return env


def launch(plan: Plan, ctx: failures.FailureContext) -> int:
    """Run this node's Horovod processes; the node's exit code."""
    topo = plan.topology
    tuning = dict(plan.framework_env)
    if topo.is_chief_node:
        log.info("horovod fusion threshold %s bytes, cycle time %s ms%s", tuning[ev.HOROVOD_FUSION_THRESHOLD],
                 tuning[ev.HOROVOD_CYCLE_TIME], ", autotune on" if ev.HOROVOD_AUTOTUNE in tuning else "")
    if topo.processes_started_externally:  # mpirun / horovodrun started us: placed by their ranks
        return run_process(plan, ctx)
    nproc = plan.nproc_per_node
    host, port = topo.chief_host_port() or ("127.0.0.1", free_ports(1)[0])
    server = start_rendezvous(topo, nproc, port) if topo.is_chief_node else None
    placements = [place(topo, nproc, local_rank) for local_rank in range(nproc)]
    replicas = [Replica("rank", placed.training_rank,
                        {**os.environ, **worker_env(topo, placed, host, port, plan.options.timeout)},
                        [sys.executable, "-m", "entrypoint.worker"]) for placed in placements]
    log.info("node %s/%s: %d Horovod process(es), world size %d, rendezvous %s:%d", topo.node_rank,
             topo.num_nodes, nproc, plan.world_size, host, port)
    try:
        # the workers' own lines (a user's print() too) pass through here: hide what this node's lines hide
        return run_replicas(replicas, label="horovod", grace=plan.options.grace_period, secrets=logs.secrets()).code
    finally:
        if server is not None:
            server.shutdown()
