"""How the model is spread over the ranks: replicated (DDP, Horovod) or sharded (FSDP2, HSDP), chosen once per run.

``choose`` decides after ``build_model`` (``layout.py`` calls it, with every mesh fact): an explicit ``--strategy``
wins (HSDP where it cannot be, on one node or on nodes of one process, is FSDP); otherwise DDP while the model's
parameters, gradients and Adam state (16 bytes a parameter in fp32) fit in half of one device's memory, FSDP
when they do not (HSDP across nodes when a node's devices hold them together). The first log line and the
training summary say which and why.

- ``Replicated``: every rank holds the whole model; ``Collectives.prepare`` wraps it (DDP over nccl/gloo, or
  Horovod's optimizer). ``--compile`` compiles the wrapped model (DDP's graph is split at its buckets).
- ``Sharded``: ``fully_shard`` (FSDP2) over a 1-D mesh of every rank (``fsdp``), or a 2-D mesh replicating across
  nodes and sharding within a node (``hsdp``); where survivors keep training, HSDP shards over the node's own group
  and the loop averages across replicas itself (``reduce_gradients``; ``launch/replicas.py`` says why). Each shard
  unit (the module's ``shard_units(model, ctx)`` hook, else ``default_units``: the repeated blocks, as torchtitan
  shards each transformer block) is sharded, then the root. ``--compile`` compiles each unit before it is sharded;
  ``--bf16`` on GPU keeps bf16 parameters for compute with fp32 gradient reductions (``MixedPrecisionPolicy``). On
  CPU, allocations from 128 KiB up are mapped and given back to the system when freed (glibc's ``mallopt``, unless the
  user set ``MALLOC_MMAP_THRESHOLD_``): glibc's default keeps the freed full-size buffers of FSDP's all-gathers in its
  heap, and a rank then holds as much as a DDP rank (docs/pytorch.md, measured).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments.settings import user_overrides
from entrypoint.errors import ConfigError
from entrypoint.planning.registry import Framework
from entrypoint.pytorch.checkpoints.checkpoint_io import LOAD_WITH
from entrypoint.pytorch.defaults import param_digest
from entrypoint.pytorch.launch.replicas import NodeReplicas
from entrypoint.pytorch.loop import pretrained

log = logging.getLogger("entrypoint.pytorch")
BYTES_PER_PARAMETER = 16  # fp32 parameter + gradient + Adam's two moments
FIT_FRACTION = 0.5  # of one device's memory: the rest is for activations, buffers and the allocator
UNIT_FRACTION = 0.01  # a repeated block holding at least this share of the parameters is its own shard unit
SHARDED = ("fsdp", "hsdp")
# How the training summary says to load what the job wrote (``load_with``), by layout.
LOAD_REPLICATED = ("torch.load('model.pt', weights_only=False)  # or safetensors.torch.load_file('model.safetensors'), "
                   f"or state_dict.pt into build_model(); a checkpoint: {LOAD_WITH}")
LOAD_SHARDED = ("safetensors.torch.load_file('model.safetensors') into build_model(); a checkpoint: "
                "torch.distributed.checkpoint.load(...) at any world size, or "
                "torch.distributed.checkpoint.format_utils.dcp_to_torch_save(<checkpoint>, 'full.pt')")
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
CPU_MMAP_THRESHOLD = 128 * 1024  # bytes: FSDP's gathered blocks are far above it, small tensors stay in the heap


@dataclass(frozen=True)
class Choice:
    """The strategy this run uses and why (said in the first log line and the summary)."""

    name: str  # "default", "ddp", "fsdp" or "hsdp"
    reason: str

    @property
    def sharded(self) -> bool:
        """Whether every rank holds only its shard of the parameters, gradients and optimizer state."""
        return self.name in SHARDED


def device_memory(device: torch.device, local_world_size: int) -> int:
    """Bytes one training process can use: its GPU's memory, or this host's memory shared by its processes."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return int(pages * page_size) // max(local_world_size, 1)


def choose(planned: str, forced: bool, parameters: int, memory: int, world_size: int, num_nodes: int,
           local_world_size: int, framework: Framework) -> Choice:
    """The strategy for ``parameters`` on devices of ``memory`` bytes: ``planned`` when forced, else by size
    (between replicated and sharded where the ``framework`` offers FSDP)."""
    need = parameters * BYTES_PER_PARAMETER
    words = f"{parameters / 1e6:,.1f}M parameters need {need / 2**30:.1f} GiB for weights, gradients and Adam state"
    if world_size == 1 and planned in SHARDED:
        return Choice("default", f"--strategy {planned} on a single process: nothing to shard")
    hsdp = num_nodes > 1 and local_world_size > 1 and world_size == num_nodes * local_world_size
    if forced and planned == "hsdp" and not hsdp:  # one node, or nodes of one process: one way to shard
        return Choice("fsdp", "--strategy hsdp; HSDP needs several nodes of several processes: FSDP")
    if forced or world_size == 1 or "fsdp" not in framework.strategies:
        return Choice(planned, f"--strategy {planned}" if forced else ("a single process" if world_size == 1 else
                                                                         f"{framework.name}: replicated"))
    fits = need <= FIT_FRACTION * memory
    if fits:
        return Choice("ddp", f"{words}, within half of one device's {memory / 2**30:.1f} GiB: DDP")
    if hsdp and need / local_world_size <= FIT_FRACTION * memory:
        return Choice("hsdp", f"{words}, more than half of one device's {memory / 2**30:.1f} GiB but within a "
                              f"node's {local_world_size}: HSDP (sharded within a node, replicated across nodes)")
    return Choice("fsdp", f"{words}, more than half of one device's {memory / 2**30:.1f} GiB: FSDP over all "
                          f"{world_size} ranks")


def default_units(model: nn.Module, fraction: float = UNIT_FRACTION) -> list[nn.Module]:
    """The repeated blocks (members of an ``nn.ModuleList`` or ``nn.Sequential``) holding at least ``fraction`` of
    the parameters each, outermost first; a block inside a unit is not a unit of its own."""
    total = sum(p.numel() for p in model.parameters())
    units: list[nn.Module] = []
    taken: set[int] = set()

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if id(child) in taken:
                continue
            if isinstance(module, (nn.ModuleList, nn.Sequential)) and \
                    sum(p.numel() for p in child.parameters()) >= fraction * total > 0:
                units.append(child)
                taken.update(id(m) for m in child.modules())
                continue
            visit(child)

    visit(model)
    return units


def named_units(model: nn.Module, names: Iterable[Any]) -> list[nn.Module]:
    """The modules a ``shard_units`` hook named (module objects or their dotted names); a one-line error for others."""
    modules = dict(model.named_modules())
    ids = {id(m) for m in modules.values()}
    found: list[nn.Module] = []
    missing: list[str] = []
    for item in names:
        if isinstance(item, nn.Module) and id(item) in ids:
            found.append(item)
        elif isinstance(item, nn.Module):
            missing.append(f"a {type(item).__name__} that is not part of the model")
        elif isinstance(item, str) and item in modules and item:
            found.append(modules[item])
        else:
            missing.append(repr(item)[:80])
    if missing:
        raise ConfigError("shard_units", f"names modules that are not in the model: {', '.join(map(str, missing))} "
                          "(return submodules of the model, or their names from model.named_modules())")
    return found


def same_weights_everywhere(model: nn.Module, comm: Any) -> None:
    """Before sharding, every rank must hold the same first weights (each keeps only its shards of its own copy)."""
    if pretrained.on_meta(model):
        return  # no weights yet: every rank loads the same checkpoint (--init-from)
    fingerprint = [round(float(p.detach().double().sum()), 6) for p in model.parameters()]
    views = comm.gather_object(fingerprint)
    different = [rank for rank, view in enumerate(views) if view != views[0]]
    if different:
        raise ConfigError("build_model", f"gives other first weights on rank {different[0]} than on rank 0 (seed "
                          "them the same way on every rank, e.g. torch.manual_seed(...) in build_model)")


class Replicated:
    """Every rank holds the whole model (DDP over torch.distributed, or Horovod); gradients are averaged."""

    def __init__(self, comm: Any, device: torch.device, bucket_cap_mb: int, compile: bool) -> None:
        self.comm, self.device, self.bucket_cap_mb, self.compile = comm, device, bucket_cap_mb, compile

    def shard(self, model: nn.Module, units: Callable[[nn.Module], list[nn.Module]] | None) -> nn.Module:
        """The model on this rank's device (nothing to shard)."""
        if pretrained.on_meta(model):
            pretrained.materialize(model, self.device)
            return model
        return model.to(self.device)

    def reduce_gradients(self, model: nn.Module) -> None:
        """Nothing after backward: the wrapper averaged the gradients in it."""

    def wrap(self, model: nn.Module, optimizer: Any) -> tuple[nn.Module, Any]:
        """The data-parallel wrapper (rank 0's parameters reach every rank), compiled with ``--compile``."""
        wrapped, optimizer = self.comm.prepare(model, optimizer, self.device, self.bucket_cap_mb)
        if self.compile:
            wrapped = torch.compile(wrapped)
        return wrapped, optimizer

    def digest(self, model: nn.Module) -> str:
        """A digest of every parameter: equal on every rank when the replicas are in sync."""
        return param_digest(model)


PLACING_MODULES = ("torch._dynamo",)  # a torch.optim optimizer's construction imports it (and fully_shard does)
SHARDED_MODULES = ("torch.distributed.device_mesh", "torch.distributed.fsdp", "torch.distributed.tensor")


def preload(strategy: str | None) -> list[str]:
    """The modules placing the model and building its optimizer import, imported now (the names): a replacement does
    this before it announces itself, not after the survivors took it in, where they would wait for it (1.5-3.5 s of
    imports on 2 shared cores, ``torch._dynamo`` most of it)."""
    names = [*PLACING_MODULES, *(SHARDED_MODULES if strategy in ("fsdp", "hsdp") else ())]
    import importlib

    for name in names:
        importlib.import_module(name)
    return names


class Sharded:
    """FSDP2 (``fully_shard``) over every rank, or HSDP: sharded within a node, replicated across nodes."""

    def __init__(self, choice: Choice, device: torch.device, num_nodes: int, local_world_size: int, bf16: bool,
                 compile: bool, by_node: NodeReplicas | None = None,
                 average: Callable[[list[torch.Tensor]], None] | None = None, regroups: bool = False) -> None:
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

        self.device, self.compile, self.average = device, compile, average  # average: across replicas (by node)
        self.regroups = regroups  # FSDP whose survivors re-form the job's group: the mesh follows it (``wrap``)
        if by_node is not None:  # HSDP whose replicas survive a lost node: FSDP within the node (``replicas.py``)
            self.mesh = DeviceMesh.from_group(by_node.form_node(), device.type, mesh_dim_names=("shard",))
        elif choice.name == "hsdp":  # ``choose`` made it FSDP where the ranks are not nodes x processes per node
            self.mesh = init_device_mesh(device.type, (num_nodes, local_world_size),
                                         mesh_dim_names=("replicate", "shard"))
        else:
            self.mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("shard",))
        self.bf16 = bf16 and device.type == "cuda"
        if device.type == "cpu" and give_large_buffers_back() and dist.get_rank() == 0:  # every rank does, one says
            log.info("sharded on CPU: allocations from %d KiB up are given back to the system when freed (mallopt; "
                     "%s chooses another threshold)", CPU_MMAP_THRESHOLD // 1024, ev.MALLOC_MMAP_THRESHOLD)

    def shard(self, model: nn.Module, units: Callable[[nn.Module], list[nn.Module]] | None) -> nn.Module:
        """Every unit sharded (compiled first with ``--compile``), then the root; each rank keeps its shards."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        chosen = units(model) if units is not None else default_units(model)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if self.bf16 else \
            MixedPrecisionPolicy()
        for unit in chosen:
            if self.compile:
                compile_forward(unit)
            fully_shard(unit, mesh=self.mesh, mp_policy=policy)
        fully_shard(model, mesh=self.mesh, mp_policy=policy)
        if pretrained.on_meta(model):  # built without weights (--init-from): memory for this rank's shards only
            pretrained.materialize(model, self.device)
        elif self.device.type == "cuda":
            model.to(self.device)
        log.debug("sharded %d units and the root over %s", len(chosen), self.mesh)
        return model

    def wrap(self, model: nn.Module, optimizer: Any) -> tuple[nn.Module, Any]:
        """Nothing to wrap: the sharded model reduces its own gradients (over the current group: ``regroup``)."""
        if self.regroups:
            regroup(model, self.mesh)
        return model, optimizer

    def reduce_gradients(self, model: nn.Module) -> None:
        """After backward: HSDP by node averages the node's reduced gradient shards across the replicas (FSDP2's
        own 2-D mesh did it in backward)."""
        if self.average is not None:
            from torch.distributed.tensor import DTensor

            grads = [p.grad for p in model.parameters() if p.grad is not None]
            self.average([g.to_local() if isinstance(g, DTensor) else g for g in grads])

    def digest(self, model: nn.Module) -> str:
        """A digest of this rank's shards (ranks hold different shards: compare one rank across runs)."""
        return param_digest(model)


def regroup(model: nn.Module, mesh: Any) -> None:
    """FSDP over every rank whose survivors re-formed the job's group after a lost peer: the mesh and every unit
    ``fully_shard`` made (its mesh infos captured the group once) gather and reduce on the current group from now
    on. Its shards, ranks and layout are unchanged (the same world size): only the broken group is swapped, and the
    step the loss cut off is forgotten (``reset_cut_step``)."""
    from torch.distributed.distributed_c10d import _get_default_group
    from torch.distributed.fsdp import FSDPModule

    reset_cut_step(model)
    group = _get_default_group()
    name = group.group_name
    mesh._dim_group_names = [name]
    registry = getattr(mesh, "_pg_registry", None)
    if isinstance(registry, dict):
        registry.clear()
        registry[name] = group
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        params = module._get_fsdp_state()._fsdp_param_group
        if params is None:
            continue
        infos = [params.mesh_info, params.post_forward_mesh_info]
        for param in params.fsdp_params:
            infos += [param.mesh_info, param.post_forward_mesh_info]
        for info in infos:
            if info is not None and hasattr(info, "shard_process_group"):
                info.shard_process_group = group


def reset_cut_step(model: nn.Module) -> bool:
    """A survivor's FSDP model after a step cut off inside its forward or backward: every unit resharded and the
    step's trackers cleared (FSDP2's ``reset_iter_state``), so that its next step gathers and reduces the same units
    in the same order as a replacement's fresh model. Without it a unit left unsharded, or the forward order recorded
    for the backward's prefetch, made a survivor's collectives differ from the replacement's after a heal (gloo:
    "Received data size doesn't match expected size", SIGABRT). The cut step's collectives were on the broken group:
    nothing of them is waited for. False: nothing to reset (a model not yet run, or a torch without it)."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule) or not hasattr(model, "reset_iter_state"):
        return False
    state = model._get_fsdp_state()
    if not state._is_root:  # not run yet (a replacement's fresh model): nothing cut off
        return False
    for unit in state._state_ctx.all_states:
        for params in unit._fsdp_param_groups:
            params._all_gather_result = None  # an all-gather of the broken group: never waited for
    state._comm_ctx.all_gather_state = None
    state._comm_ctx.reduce_scatter_states.clear()
    model.reset_iter_state()
    return True


def compile_forward(unit: nn.Module) -> None:
    """``torch.compile`` of the unit's forward, called from a frame of ours. Dynamo does not start tracing in a frame
    of torch.nn's own code, so ``unit.compile()`` compiled nothing for ``nn.Sequential``,
    ``nn.TransformerEncoderLayer`` and the other built-in modules; from here it inlines their forward (FSDP's hooks,
    around the forward, stay outside the graph as before)."""
    forward = unit.forward

    def traced(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)

    unit.forward = torch.compile(traced)


def give_large_buffers_back() -> bool:
    """glibc's malloc maps allocations from ``CPU_MMAP_THRESHOLD`` up and unmaps them when freed (True), unless the
    user chose a threshold (glibc read it at start) or the C library has no such setting (musl: False)."""
    if user_overrides((ev.MALLOC_MMAP_THRESHOLD,)):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, CPU_MMAP_THRESHOLD))


def compile_seconds() -> float:
    """Seconds torch.compile spent compiling so far in this process (0 when nothing was compiled)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:  # pragma: no cover - a torch without dynamo
        return 0.0
    return float(sum(sum(times) for key, times in compilation_time_metrics.items()
                     if key == "_compile.compile_inner" or "bw_compiler" in key))
