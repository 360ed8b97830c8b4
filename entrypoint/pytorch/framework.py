"""PyTorch as the registry sees it: DDP over nccl (GPU) or gloo (CPU), one process per GPU.

Imports nothing heavy: ``describe`` plans a PyTorch job without importing torch.
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.placement import job_world_size
from entrypoint.cluster.topology import ClusterTopology
from entrypoint.errors import ConfigError
from entrypoint.options import RunOptions, positive_int
from entrypoint.outputs.locations import OutputDirs
from entrypoint.planning.registry import Flag, Framework, NodePlan, ServerPool


def plan_torch_node(topo: ClusterTopology, options: RunOptions, gpus: int,
                    name: str) -> tuple[int, str, ServerPool | None]:
    """Processes per node, why, and how workerpool2 reads, for frameworks that run one process per GPU."""
    variable = ev.TF_CONFIG if topo.source == "tf_config" else ev.CLUSTER_SPEC
    if topo.role == "ps":
        raise ConfigError(variable, f"this replica is in the server pool, which is a Reduction Server for {name}: "
                          "run Google's reductionserver image in workerpool2, not this one", "task.type")
    if topo.role == "evaluator":
        raise ConfigError(variable, f"evaluator replicas are supported with tensorflow, not {name}", "task.type")
    server_pool: ServerPool | None = None
    if topo.servers:
        server_pool = "reduction_server" if topo.source == "vertex" else "unused"
    if topo.platform_ranks is not None:
        return topo.platform_ranks.local_world_size, "processes started by the platform", server_pool
    nproc = options.nproc_per_node or topo.nproc_per_node or max(gpus, 1)
    reason = "--nproc-per-node" if options.nproc_per_node else (
        "one process per GPU" if gpus else "one process per node on CPU (gloo)")
    return nproc, reason, server_pool


def plan(topo: ClusterTopology, options: RunOptions, user_set: Mapping[str, str], gpus: int,
         outputs: OutputDirs) -> NodePlan:
    """DDP across every process of every node; a single process trains without DDP."""
    nproc, reason, server_pool = plan_torch_node(topo, options, gpus, "pytorch")
    world = job_world_size(topo, nproc)
    strategy = options.strategy or ("ddp" if world > 1 else "default")
    if world == 1 and options.strategy is None:
        reason = "a single process"
    env = {} if topo.processes_started_externally else torchrun_defaults(nproc, user_set)
    return NodePlan(strategy=strategy, reason=reason, nproc_per_node=nproc, server_pool=server_pool, env=env,
                    own_barrier=True)


USER_VARIABLES = (ev.OMP_NUM_THREADS, ev.TORCH_NCCL_ASYNC_ERROR_HANDLING)  # torchrun keeps the user's values
RECOVERY_DEFAULT = "in-place"
BUCKET_CAP_MB_DEFAULT = 64
FLAGS = (
    Flag("--recovery", "a lost peer (PyTorch hooks across nodes): in-place: the survivors keep training with its "
         "replacement (default); restart: every process exits, the job restarts from its checkpoint",
         choices=("in-place", "restart")),
    Flag("--bucket-cap-mb", f"DDP gradient bucket size (default {BUCKET_CAP_MB_DEFAULT})", positive_int),
)


def torchrun_defaults(nproc: int, user_set: Mapping[str, str]) -> dict[str, str]:
    """torchrun's defaults besides ranks (one OpenMP thread per process when a node runs several), unless the user's."""
    defaults = {ev.TORCH_NCCL_ASYNC_ERROR_HANDLING: "1"}
    if nproc > 1:
        defaults[ev.OMP_NUM_THREADS] = "1"
    return {name: value for name, value in defaults.items() if name not in user_set}


# torch.distributed's errors for a peer gone, a store or rendezvous timed out; gloo's own errors are RuntimeErrors
# raised where the collectives run: torch.distributed, DDP (torch.nn.parallel), its all-reduce in the backward
# pass (torch.autograd), and the loop's own collectives (entrypoint.pytorch).
PEER_ERRORS = ("torch.distributed.DistNetworkError", "torch.distributed.DistStoreError",
               "torch.distributed.DistBackendError", "torch.distributed.elastic.rendezvous.RendezvousTimeoutError",
               "torch.distributed.elastic.rendezvous.RendezvousClosedError",
               "torch.distributed.elastic.rendezvous.RendezvousConnectionError")
PEER_MODULES = ("torch.distributed", "torch.nn.parallel", "torch.autograd", "entrypoint.pytorch")

FRAMEWORK = Framework(
    name="pytorch",
    probe="torch",
    strategies=("default", "ddp"),
    plan=plan,
    launcher="entrypoint.pytorch.launch:launch",
    worker="entrypoint.pytorch.worker:run",
    flags=FLAGS,
    user_variables=USER_VARIABLES,
    peer_errors=PEER_ERRORS,
    peer_modules=PEER_MODULES,
)
