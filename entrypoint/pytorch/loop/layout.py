"""The run's parallel layout, decided once after ``build_model``: one frozen value the rest of the run reads.

``lay_out`` takes every fact the decision needs (the model's size, the device's memory, the ranks, nodes and processes
per node, the framework, ``--strategy``, ``--checkpoint-mode``) and returns a ``Layout``: the choice and why
(``parallel.choose``: HSDP that cannot be is FSDP there already), how the model is spread (``Replicated``: placed on
its device, wrapped by DDP or Horovod; ``Sharded``: FSDP2 over its mesh), its checkpoint format for the mode as given
(``formats.py``: the chief's ``state.pt``, or every rank's shards), whether its evaluation runs in lockstep, how it
exports (``export.py``: the chief's whole copy, or every rank's shards streamed) and how it survives a lost peer
(survivors keep training, and a returning rank heals from a live replica: the whole model's rank 0, or under HSDP the
same local rank of a live node; or the job restarts from its checkpoint). Nothing before it needs the layout patched in,
and nothing after it asks which one it is: each reads the fact it needs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from entrypoint.planning import registry
from entrypoint.planning.plan import Plan
from entrypoint.pytorch.checkpoints.formats import CheckpointFormat, ReplicatedFormat, ShardedFormat
from entrypoint.pytorch.framework import BUCKET_CAP_MB_DEFAULT, PEER_SNAPSHOTS_DEFAULT
from entrypoint.pytorch.launch.collectives import Collectives, TorchDistributed
from entrypoint.pytorch.loop import parallel
from entrypoint.pytorch.loop.export import SHARDS, WHOLE, Export
from entrypoint.pytorch.loop.parallel import Choice, Replicated, Sharded

log = logging.getLogger("entrypoint.pytorch")


@dataclass(frozen=True)
class Layout:
    """How this run spreads its model over the ranks, and everything that follows from it."""

    choice: Choice  # the strategy and why (the first log line, the summary)
    model: Replicated | Sharded  # places, shards and wraps the model; its parameters' digest
    checkpoints: CheckpointFormat  # what a save holds, who writes it, how a resume picks and loads
    evaluates_in_lockstep: bool  # the evaluation's forward pass is a collective: every rank runs as many batches
    export: Export  # who exports, from which copy, and what beside ``model.safetensors``
    survives_lost_peer: bool  # survivors may keep training (a live replica holds the lost one's state); else a restart
    load_with: str  # how the training summary says to load what the job wrote
    replica_size: int = 1  # ranks that hold one replica together: a healed rank r takes rank r % replica_size's state
    peer_snapshots: bool = False  # FSDP across nodes: each rank's shards in a peer's memory heal a lost node


def lay_out(model: nn.Module, plan: Plan, comm: Collectives, device: torch.device, compiled: bool,
            survivors: TorchDistributed | None = None, healing: bool = False) -> Layout:
    """The layout for ``model`` (built, not yet placed) on this run's ranks; the chief says which and why.
    ``survivors``: the group that survivors re-form after a lost peer (None: a lost peer restarts the job), which HSDP
    then shards by node; ``healing``: this process replaces a lost one and takes its weights from a live replica."""
    options, placed = plan.options, plan.placed
    nodes, local = max(plan.topology.num_nodes, 1), placed.local_world_size
    choice = parallel.choose(plan.strategy, options.strategy is not None, sum(p.numel() for p in model.parameters()),
                             parallel.device_memory(device, local), placed.world_size, nodes, local,
                             registry.get(plan.framework))
    if placed.training_rank == 0:
        log.info("strategy %s: %s", choice.name, choice.reason)
    mode, keep = options.checkpoint_mode, options.keep_checkpoints
    if not choice.sharded:
        bucket_cap_mb = options.framework_option("bucket_cap_mb", BUCKET_CAP_MB_DEFAULT)
        return Layout(choice, Replicated(comm, device, bucket_cap_mb, compiled),
                      ReplicatedFormat.for_mode(mode, keep, device, placed.training_rank == 0),
                      evaluates_in_lockstep=False, export=WHOLE, survives_lost_peer=True,
                      load_with=parallel.LOAD_REPLICATED)
    if not healing:  # a replacement's weights come from the live replica
        parallel.same_weights_everywhere(model, comm)
    by_node = survivors.by_node(placed.local_rank, local) if survivors is not None and choice.name == "hsdp" else None
    peers = survivors is not None and choice.name == "fsdp" and nodes > 1 and \
        options.framework_option("peer_snapshots", PEER_SNAPSHOTS_DEFAULT) == "on"
    sharded = Sharded(choice, device, nodes, local, options.bf16, compiled, by_node,
                      survivors.average_replicas if by_node is not None and survivors is not None else None,
                      regroups=peers)
    return Layout(choice, sharded,
                  ShardedFormat.for_mode(mode, keep, placed.training_rank, options.timeout, device.type == "cuda"),
                  evaluates_in_lockstep=True, export=SHARDS, survives_lost_peer=by_node is not None or peers,
                  load_with=parallel.LOAD_SHARDED, replica_size=local if by_node is not None else 1,
                  peer_snapshots=peers)
