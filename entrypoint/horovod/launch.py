"""Launch Horovod without ssh: each replica starts its own local processes, which meet through
Horovod's own gloo rendezvous server hosted by the chief, the way Horovod's Ray and Spark
integrations start workers (rank, size, local and cross ranks derived from the topology).

When ``mpirun`` / ``horovodrun`` already started this process (OMPI_* / HOROVOD_* set), that is used.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
import threading
from typing import Any

from entrypoint import envvars as ev
from entrypoint.environments import read_settings
from entrypoint.errors import ExitCode, RetryableError
from entrypoint.options import RunOptions
from entrypoint.plan import Plan
from entrypoint.progress import setup_logging
from entrypoint.pytorch.launch import missing_peers, worker_command
from entrypoint.supervisor import Replica, free_ports, run_replicas
from entrypoint.topology import ClusterTopology
from entrypoint.usercode import require_code

log = logging.getLogger("entrypoint.horovod")
WORKER = "entrypoint.horovod.worker"


def node_name(node_rank: int) -> str:
    """The Horovod host name of a node (unique per node, also when every node is 127.0.0.1)."""
    return f"node{node_rank}"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False


def start_rendezvous(topo: ClusterTopology, nproc: int, port: int) -> Any:
    """Horovod's own HTTP rendezvous server on the chief's port, initialised with the slot plan.

    Its handler is Horovod's, plus a note of every key put into a scope: the server clears a scope
    once every rank is through, so only this record tells, after a failure, who never came.
    """
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    class RecordingHandler(RendezvousHandler):
        def _put_value(self, scope: str, key: str, value: bytes) -> None:
            super()._put_value(scope, key, value)
            with self.server.cache_lock:
                self.server.seen_keys.setdefault(scope, set()).add(key)

    hosts = [HostInfo(node_name(i), nproc) for i in range(topo.num_nodes)]
    server = RendezvousHTTPServer(("", port), RecordingHandler, 0)
    server.seen_keys = {}
    server.init(get_host_assignments(hosts, topo.num_nodes * nproc))
    threading.Thread(target=server.serve_forever, name="horovod-rendezvous", daemon=True).start()
    return server


def registered_ranks(server: Any) -> set[int]:
    """Ranks that reached the global gloo rendezvous (the keys they put, as recorded)."""
    with server.cache_lock:
        keys = list(server.seen_keys.get("global", set()))
    ranks = set()
    for key in keys:
        digits = "".join(c for c in str(key) if c.isdigit())
        if digits:
            ranks.add(int(digits))
    return ranks


def worker_env(topo: ClusterTopology, nproc: int, host: str, port: int, local_rank: int,
               timeout: float) -> dict[str, str]:
    """The HOROVOD_* variables horovodrun would give this process."""
    node = topo.node_rank or 0
    env = {
        ev.HOROVOD_RANK: str(node * nproc + local_rank),
        ev.HOROVOD_SIZE: str(topo.num_nodes * nproc),
        ev.HOROVOD_LOCAL_RANK: str(local_rank),
        ev.HOROVOD_LOCAL_SIZE: str(nproc),
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
        env["HOROVOD_GLOO_IFACE"] = "lo"
    return env


def launch(plan: Plan, options: RunOptions) -> int:
    """Run the user's Horovod code on this node."""
    setup_logging()
    topo = plan.topology
    kind, target = require_code(options, read_settings().module)
    command = worker_command(options, kind, target, worker_module=WORKER)
    os.environ.update(plan.emitted_env())
    tuning = dict(plan.framework_env)
    if topo.is_chief_node:
        log.info("horovod fusion threshold %s bytes, cycle time %s ms%s", tuning[ev.HOROVOD_FUSION_THRESHOLD],
                 tuning[ev.HOROVOD_CYCLE_TIME], ", autotune on" if ev.HOROVOD_AUTOTUNE in tuning else "")
    if topo.per_process:  # mpirun / horovodrun started us: use their ranks
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, *command])
    nproc = plan.nproc_per_node
    host, port = topo.chief_host_port() if topo.chief_address else ("127.0.0.1", free_ports(1)[0])
    server = start_rendezvous(topo, nproc, port) if topo.is_chief_node else None
    replicas = []
    for local_rank in range(nproc):
        env = {**os.environ, **worker_env(topo, nproc, host, port, local_rank, options.timeout)}
        replicas.append(Replica("rank", int(env[ev.HOROVOD_RANK]), env, [sys.executable, *command]))
    log.info("node %s/%s: %d Horovod process(es), world size %d, rendezvous %s:%d", topo.node_rank,
             topo.num_nodes, nproc, plan.world_size, host, port)
    try:
        code = run_replicas(replicas, label="horovod")
    finally:
        missing = (set(range(topo.num_nodes * nproc)) - registered_ranks(server)) if server is not None else set()
        if server is not None:
            server.shutdown()
    failed_at = f"Horovod rendezvous at {host}:{port} failed after {int(options.timeout)}s"
    if code != 0 and server is not None and {rank // nproc for rank in missing} - {0}:
        nodes = sorted({rank // nproc for rank in missing})
        raise RetryableError(f"{failed_at}: {missing_peers(topo)} never came (missing node ranks {nodes})")
    if code != 0 and server is None and not _reachable(host, port):
        raise RetryableError(f"{failed_at}: {missing_peers(topo)} never came")
    return int(code) if code else ExitCode.OK
