"""One checkpoint format per parallel layout: what a save holds, who writes it, how a resume picks and loads a
checkpoint, and how a checkpoint of either format loads into this layout's model. The layout (``layout.py``) makes its
format once, for ``--checkpoint-mode`` as given (``for_mode``: the mode picks the writer); ``LoopCheckpoints``
(``resume.py``) keeps the policy (the newest that loads, the position and random streams, what a recovery cost) and
saves and resumes through the format, never asking which one it has.

- ``ReplicatedFormat`` (DDP, Horovod, one process): the chief writes the whole state as ``state.pt``
  (``ReplicatedCheckpointIO``, sync or async). Its resume: the chief picks alone, trying each candidate by loading
  it, then broadcasts its choice, which every other rank loads.
- ``ShardedFormat`` (FSDP, HSDP): every rank writes its shards with torch.distributed.checkpoint
  (``ShardedCheckpointIO``, sync or async). Its resume: every rank joins each candidate the chief tries (``dcp.load``
  is a collective, and reshards to any world size): each verifies its share of the files, then all load; a
  candidate that fails on any rank is skipped on all.

Each loads the other's checkpoints too (the cross-format resume): a ``state.pt`` into a sharded model (each rank takes
its shards of the full state), a sharded checkpoint into a replicated model (read whole by this process alone).
Every file is read by its writer's reader (``ReplicatedCheckpointIO.load``, ``ShardedCheckpointIO.load`` and
``load_whole``). Before anything is read, a sharded checkpoint's tensor shapes are compared with the model's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from entrypoint.errors import Interrupted
from entrypoint.outputs import checkpoints, storage
from entrypoint.outputs.checkpoints import CheckpointWriter
from entrypoint.outputs.storage import Location
from entrypoint.pytorch.checkpoints import restore
from entrypoint.pytorch.checkpoints.checkpoint_io import ReplicatedCheckpointIO
from entrypoint.pytorch.checkpoints.sharded_io import HostCopy, ShardedCheckpointIO, is_sharded_checkpoint
from entrypoint.pytorch.launch.collectives import Collectives
from entrypoint.pytorch.state import TrainState


@dataclass(frozen=True)
class Picked:
    """The chief's pick, as every rank learns it: the checkpoint (None: nothing to resume from), or why none can be
    (a ``ConfigError``'s source and problem), and what resuming there cost (``lost_work.Recovery``'s fields)."""

    path: str | None = None
    error: tuple[str, str] | None = None
    cost: dict[str, Any] | None = None


# The policy (``LoopCheckpoints``): given how to attempt a candidate, and how to verify one before that (None:
# ``checkpoints.verify``), the chief's pick.
Pick = Callable[[Callable[[Location], None], Callable[[Location], None] | None], Picked]
Load = Callable[[Location], None]  # a committed checkpoint into this rank's state (the format's ``load``, then more)


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

    def save(self, path: Location, state: TrainState, extra: dict[str, Any], meta: dict[str, Any],
             host: HostCopy | None = None) -> None:
        """The whole model and optimizer with ``extra`` (position, history, RNG of every rank), by the chief (the
        others write nothing; no snapshot's ``host`` copy is made of a replicated model)."""
        if self.is_chief:
            self.io.save(path, {**replicated_payload(state.model, state.optimizer), **extra}, meta)

    def resume(self, comm: Collectives, pick: Pick, load: Load) -> Picked:
        """The chief picks alone, loading each candidate it tries; every other rank then loads its pick."""
        picked = comm.broadcast_object(pick(load, None) if self.is_chief else None)
        if picked.path is not None and not self.is_chief:
            load(storage.path(picked.path))
        return picked

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

    def save(self, path: Location, state: TrainState, extra: dict[str, Any], meta: dict[str, Any],
             host: HostCopy | None = None) -> None:
        """This rank's shards of the model and optimizer (from ``host``, the snapshot's copy, where one is made);
        ``extra`` goes into the chief's ``extra.pt``."""
        self.io.save(path, {"shards": restore.sharded_state(state.model, state.optimizer), "extra": extra,
                            "host": host}, meta)

    def resume(self, comm: Collectives, pick: Pick, load: Load) -> Picked:
        """Every rank joins each candidate the chief tries (``attempt``), until the chief has picked; its pick."""
        picked = None
        if self.io.is_chief:
            def together(path: Location) -> None:
                comm.broadcast_object(str(path))
                failed = [o for o in comm.gather_object(self._attempt(comm, path, load)) if o is not None]
                if failed:
                    raise checkpoints.CheckpointError(failed[0])

            try:  # each rank verifies its own share of the files, in ``attempt``
                picked = pick(together, lambda _path: None)
            finally:
                comm.broadcast_object(None)  # the others stop following the chief's attempts
        else:
            while (path_text := comm.broadcast_object(None)) is not None:
                comm.gather_object(self._attempt(comm, storage.path(path_text), load))
        return comm.broadcast_object(picked)

    @staticmethod
    def _attempt(comm: Collectives, path: Location, load: Load) -> str | None:
        """Verify this rank's share of ``path``'s files, then (if every rank's share verified) load ``path`` into
        this rank's shards; None, or why it failed (every rank runs the same collectives)."""
        try:
            checkpoints.verify(path, share=(comm.rank, comm.world_size))
            mine = None
        except Exception as exc:
            mine = _why(exc)
        verified = [problem for problem in comm.gather_object(mine) if problem]
        if verified:
            return verified[0]
        try:
            load(path)
        except BaseException as exc:  # torch.distributed.checkpoint's CheckpointException is a BaseException
            if isinstance(exc, (KeyboardInterrupt, SystemExit, Interrupted)):  # a stop is not a bad checkpoint
                raise
            return _why(exc)
        return None

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


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300]
    return text if isinstance(exc, checkpoints.CheckpointError) else f"{type(exc).__name__}: {text}"


def writers(replicated: ReplicatedCheckpointIO, sharded: ShardedCheckpointIO) -> tuple[CheckpointWriter, ...]:
    """Both formats' writers as the one interface every training loop saves through (mypy checks they implement
    it)."""
    return replicated, sharded
