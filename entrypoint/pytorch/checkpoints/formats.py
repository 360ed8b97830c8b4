"""One checkpoint format per parallel layout: what a save holds, who writes it, and how a checkpoint of either format
loads into this layout's model. The layout (``parallel.py``) makes its format once; ``LoopCheckpoints``
(``resume.py``) saves and loads through it and never asks which one it has, but for ``collective``.

- ``ReplicatedFormat`` (DDP, Horovod, one process): the chief writes the whole state as ``state.pt``
  (``ReplicatedCheckpointIO``, sync or async); the chief picks and loads a checkpoint, then the others load it.
- ``ShardedFormat`` (FSDP, HSDP): every rank writes its shards with torch.distributed.checkpoint
  (``ShardedCheckpointIO``, sync or async), and every rank takes part in each load (``dcp.load`` is a collective,
  and reshards to any world size).

Each loads the other's checkpoints too (the cross-format resume): a ``state.pt`` into a sharded model (each rank takes
its shards of the full state), a sharded checkpoint into a replicated model (read whole by this process alone).
Every file is read by its writer's reader (``ReplicatedCheckpointIO.load``, ``ShardedCheckpointIO.load`` and
``load_whole``). Before anything is read, a sharded checkpoint's tensor shapes are compared with the model's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from entrypoint.outputs.checkpoints import CheckpointWriter
from entrypoint.outputs.storage import Location
from entrypoint.pytorch.checkpoints import restore
from entrypoint.pytorch.checkpoints.checkpoint_io import ReplicatedCheckpointIO
from entrypoint.pytorch.checkpoints.sharded_io import ShardedCheckpointIO, is_sharded_checkpoint
from entrypoint.pytorch.state import TrainState


def replicated_payload(model: nn.Module, optimizer: Any) -> dict[str, Any]:
    """A replicated model's tensors as ``state.pt`` holds them (and as the chief sends them live to a healed rank)."""
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "optimizer_fqns": restore.optimizer_fqns(model, optimizer)}


class ReplicatedFormat:
    """``state.pt``, written by the chief alone."""

    name = "replicated"
    sharded = False  # the marker's ``sharded``
    collective = False  # the chief saves, and picks and loads alone before the others load its choice

    def __init__(self, io: ReplicatedCheckpointIO, device: torch.device, is_chief: bool) -> None:
        self.io, self.device, self.is_chief = io, device, is_chief

    @classmethod
    def for_mode(cls, mode: str, keep: int, device: torch.device, is_chief: bool) -> ReplicatedFormat:
        """The format whose writer writes as ``--checkpoint-mode`` says (``checkpoint_io.MODES``)."""
        return cls(ReplicatedCheckpointIO(keep, mode), device, is_chief)

    def save(self, path: Location, state: TrainState, extra: dict[str, Any], meta: dict[str, Any]) -> None:
        """The whole model and optimizer with ``extra`` (position, history, RNG of every rank), by the chief (the
        others write nothing)."""
        if self.is_chief:
            self.io.save(path, {**replicated_payload(state.model, state.optimizer), **extra}, meta)

    def load(self, path: Location, state: TrainState) -> dict[str, Any]:
        """A committed checkpoint of either format into the replicated model and optimizer; what else it holds."""
        restore.check_shapes(state.model, path)
        if is_sharded_checkpoint(path):
            whole = restore.whole_state(state.model, state.optimizer)
            extra = ShardedCheckpointIO.load_whole(path, whole)
            restore.apply_whole(state.model, state.optimizer, whole)
            return extra
        saved = self.io.load(path, self.device)
        state.model.load_state_dict(saved["model"])
        state.optimizer.load_state_dict(saved["optimizer"])
        return saved

    def close(self) -> None:
        """The write in flight committed."""
        self.io.close()


class ShardedFormat:
    """torch.distributed.checkpoint shards, written by every rank; the chief commits them all."""

    name = "sharded"
    sharded = True
    collective = True  # every rank saves its shards and takes part in every load

    def __init__(self, io: ShardedCheckpointIO) -> None:
        self.io = io

    @classmethod
    def for_mode(cls, mode: str, keep: int, rank: int, timeout: float, cuda: bool) -> ShardedFormat:
        """The format whose writer (over a gloo group of its own, made now by every rank) writes as
        ``--checkpoint-mode`` says (``checkpoint_io.MODES``)."""
        return cls(ShardedCheckpointIO(keep, rank, mode, timeout, cuda))

    def save(self, path: Location, state: TrainState, extra: dict[str, Any], meta: dict[str, Any]) -> None:
        """This rank's shards of the model and optimizer; ``extra`` goes into the chief's ``extra.pt``."""
        self.io.save(path, {"shards": restore.sharded_state(state.model, state.optimizer), "extra": extra}, meta)

    def load(self, path: Location, state: TrainState) -> dict[str, Any]:
        """A committed checkpoint of either format into this rank's shards (resharded); what else it holds."""
        restore.check_shapes(state.model, path)
        if is_sharded_checkpoint(path):
            loaded = self.io.load(path, {"shards": restore.sharded_state(state.model, state.optimizer)})
            restore.apply_sharded(state.model, state.optimizer, loaded["shards"])
            extra: dict[str, Any] = loaded["extra"]
            return extra
        saved = ReplicatedCheckpointIO.load(path, "cpu")
        restore.apply_full(state.model, state.optimizer, saved, path)
        return saved

    def close(self) -> None:
        """The save in flight committed; the staging buffers released."""
        self.io.close()


CheckpointFormat = ReplicatedFormat | ShardedFormat


def writers(replicated: ReplicatedCheckpointIO, sharded: ShardedCheckpointIO) -> tuple[CheckpointWriter, ...]:
    """Both formats' writers as the one interface every training loop saves through (mypy checks they implement
    it)."""
    return replicated, sharded
