"""PyTorch as the registry sees it: DDP, FSDP or HSDP over nccl (GPU) or gloo (CPU), one process per GPU.

Imports nothing heavy: ``describe`` plans a PyTorch job without importing torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.placement import job_world_size
from entrypoint.cluster.topology import ClusterTopology
from entrypoint.options import RunOptions, positive_int
from entrypoint.outputs.locations import OutputDirs
from entrypoint.planning.registry import DataLoaderDefaults, Flag, Framework, NodePlan, ServerPool


def plan_torch_node(topo: ClusterTopology, options: RunOptions, gpus: int,
                    name: str) -> tuple[int, str, ServerPool | None]:
    """Processes per node, why, and how workerpool2 reads, for frameworks that run one process per GPU.

    Their replicas are chiefs and workers only (``Framework.roles``: ``make_plan`` refuses a ps or evaluator)."""
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
    """DDP across every process of every node (FSDP when the model does not fit: decided after build_model, see
    ``parallel.py``); a single process trains without either; ``--strategy`` forces one."""
    nproc, reason, server_pool = plan_torch_node(topo, options, gpus, "pytorch")
    world = job_world_size(topo, nproc)
    strategy = options.strategy or ("ddp" if world > 1 else "default")
    if world == 1 and options.strategy is None:
        reason = "a single process"
    elif options.strategy is None:
        reason += ("; DDP while the model's parameters, gradients and Adam state fit in half of one device's memory, "
                   "else FSDP (decided after build_model)")
    env = {} if topo.processes_started_externally else torchrun_defaults(nproc, user_set)
    return NodePlan(strategy=strategy, reason=reason, nproc_per_node=nproc, server_pool=server_pool, env=env,
                    own_barrier=True)


USER_VARIABLES = (ev.OMP_NUM_THREADS, ev.TORCH_NCCL_ASYNC_ERROR_HANDLING)  # torchrun keeps the user's values
RECOVERY_DEFAULT = "in-place"
PEER_SNAPSHOTS_DEFAULT = "on"
BUCKET_CAP_MB_DEFAULT = 64
# The CUDA major version of images/pytorch's GPU image: torch 2.13's PyPI wheels are built for CUDA 13.
CUDA_MAJOR = 13
# The hooks loop's DataLoader workers per process (2 on a GPU, 0 on CPU), and what a script is assumed to start.
DATA_LOADER = DataLoaderDefaults(gpu=2, cpu=0, script=1)


def peer_snapshots(plan: Any) -> str | None:
    """Whether the hooks loop keeps FSDP's snapshots in peer memory for ``plan`` (``pytorch/recovery/snapshots.py``,
    as ``membership.applies`` decides it): "fsdp", "fsdp by size" (DDP unless the model is too large), or None."""
    options, code = plan.options, plan.code
    if plan.topology.num_nodes < 2 or code is None or code.kind != "hooks" or \
            plan.topology.processes_started_externally or \
            options.framework_option("recovery", RECOVERY_DEFAULT) != "in-place" or \
            options.framework_option("peer_snapshots", PEER_SNAPSHOTS_DEFAULT) != "on":
        return None
    return "fsdp" if options.strategy == "fsdp" else "fsdp by size" if options.strategy is None else None


FLAGS = (
    Flag("--recovery", "a lost peer (PyTorch hooks across nodes, DDP or HSDP): in-place: the survivors keep "
         "training with its replacement, healed from a live replica (default); restart: every process exits, the "
         "job restarts from its checkpoint",
         choices=("in-place", "restart")),
    Flag("--peer-snapshots", "FSDP across nodes with --recovery in-place: on: at each commit every rank keeps a host "
         "copy of its shards and sends one to the same local rank of the next node, so a lost node's replacement "
         "heals from peer memory and every rank rolls back to that commit (default); off: a lost peer restarts the "
         "job from its newest sharded checkpoint", choices=("on", "off")),
    Flag("--snapshot-every", "FSDP with --peer-snapshots on: a snapshot in peer memory every N steps too, besides each "
         "commit, so that a lost node costs at most N steps (default: at each commit only)", positive_int),
    Flag("--bucket-cap-mb", f"DDP gradient bucket size (default {BUCKET_CAP_MB_DEFAULT})", positive_int),
    Flag("--compile", "torch.compile the model (each shard unit under FSDP/HSDP); the summary reports the compile "
         "time", switch=True),
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
    strategies=("default", "ddp", "fsdp", "hsdp"),
    plan=plan,
    launcher="entrypoint.pytorch.launch.node:launch",
    worker="entrypoint.pytorch.loop.worker:run",
    flags=FLAGS,
    user_variables=USER_VARIABLES,
    title="PyTorch",
    data_loader=DATA_LOADER,
    cpu_collectives="gloo",
    local_rank_variable=ev.LOCAL_RANK,  # torch's elastic agent starts each worker with it
    image="pytorch",
    cuda_major=CUDA_MAJOR,
    kubeflow_kinds=("pytorchjob", "trainjob"),
    survivors_regroup=True,
    init_from=True,  # pytorch/loop/pretrained.py
    peer_snapshots=peer_snapshots,
    peer_errors=PEER_ERRORS,
    peer_modules=PEER_MODULES,
)
