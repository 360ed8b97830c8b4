"""A host copy of this rank's training state made off the training step (FSDP's snapshots in peer memory).

A step's forward and backward leave a sharded model's parameter shards and its optimizer's state as they are; the
optimizer's step changes them. So at a snapshot the training thread takes references to those tensors only
(``references``: a fresh structure, with what is small and changes elsewhere copied at once: the position, the
history, the scheduler and the optimizer's hyperparameters, which the epoch's scheduler step changes), and the
snapshot's thread copies the tensors into host memory (``HostCopy.run``) while the next step's forward and backward
run. Whatever first changes them waits for the copy (``HostCopy.wait``): the optimizer's step (a step pre-hook on
the optimizer, ``snapshots.py``; an optimizer without one is waited for at once, as a copy on the training thread
would), a heal (``survivors.py``), the next snapshot and the end of training (the thread is joined). The copy is
therefore of exactly the state the step ended with, and so is the fingerprint made of it.

On CUDA the copies are queued on a side stream after the step's kernels (an event recorded on the training stream at
the snapshot), into pinned host memory; the training thread waits only until they are queued, and its stream waits
on the copies' event before the optimizer's step (the host does not). The snapshot's thread waits for that event
before the fingerprint. What the training thread waited (``waited``) is what the snapshot still costs the step.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from entrypoint.pytorch.checkpoints.resume import extra
from entrypoint.pytorch.state import TrainState


def _live(value: Any) -> Any:
    """A tensor's local part (a DTensor's shard), not copied; anything else as it is (numbers: immutable)."""
    if not isinstance(value, torch.Tensor):
        return value
    local = value.to_local() if hasattr(value, "to_local") else value
    return local.detach()


def references(state: TrainState, world_size: int) -> tuple[dict[str, Any], dict[tuple[Any, ...], torch.Tensor]]:
    """This rank's state as ``healing.live_shards`` lays it out, its tensors the live ones (the parameters' local
    shards and the optimizer's state, which only the optimizer's step changes), the rest copied now: the position,
    the scheduler, the optimizer's hyperparameters, and the model's buffers (a forward changes a batch norm's running
    statistics), whose copies come by where their bytes are."""
    optimizer = state.optimizer.state_dict()
    dtensors = [[index, key] for index, entry in optimizer["state"].items() for key, value in entry.items()
                if hasattr(value, "to_local")]
    optimizer["state"] = {index: {key: _live(value) for key, value in entry.items()}
                          for index, entry in optimizer["state"].items()}
    optimizer["param_groups"] = copy.deepcopy(optimizer["param_groups"])  # the scheduler's step changes them
    model = {name: _live(tensor) for name, tensor in state.model.state_dict().items()}
    parameters = {tensor_key(p) for p in state.model.parameters()}
    early = {tensor_key(t): t.to("cpu", copy=True) for t in model.values()
             if isinstance(t, torch.Tensor) and tensor_key(t) not in parameters}
    return {"model": model, "optimizer": optimizer, "dtensors": dtensors,
            **copy.deepcopy(extra(state, world_size))}, early  # the history grows, the scheduler steps


def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for value in tree.values() for t in _tensors(value)]
    if isinstance(tree, (list, tuple)):
        return [t for value in tree for t in _tensors(value)]
    return []


def _replace(tree: Any, copies: dict[int, torch.Tensor]) -> Any:
    if isinstance(tree, torch.Tensor):
        return copies[id(tree)]
    if isinstance(tree, dict):
        return {key: _replace(value, copies) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_replace(value, copies) for value in tree]
    if isinstance(tree, tuple):
        return tuple(_replace(value, copies) for value in tree)
    return tree


def tensor_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    """Where a tensor's bytes are (two views of one parameter's storage have the same key)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return (local.device, local.untyped_storage().data_ptr(), local.storage_offset(), tuple(local.shape),
            tuple(local.stride()), local.dtype)


class HostCopy:
    """One snapshot's copy: ``run`` (the snapshot's thread) copies the live tensors of ``tree`` into host memory;
    ``wait`` (the training thread, before anything changes them) returns once they are copied (CPU) or queued ahead
    of the training stream (CUDA)."""

    def __init__(self, tree: dict[str, Any], early: dict[tuple[Any, ...], torch.Tensor], step: int) -> None:
        self.tree, self.step = tree, step
        self.sources = _tensors(tree)
        self.keys = {tensor_key(t) for t in self.sources}
        self.by_place = dict(early)  # where a live tensor's bytes are -> their copy (``early``: made already)
        self.complete = threading.Event()  # the copy is in host memory (or failed: ``error``)
        self.cuda = any(t.is_cuda for t in self.sources)
        self.ready: Any = None  # CUDA: the training stream's event the copies follow
        if self.cuda:
            self.ready = torch.cuda.Event()
            self.ready.record()
        self.issued = threading.Event()  # CPU: copied; CUDA: queued on the side stream
        self.done: Any = None  # CUDA: the copies' event
        self.device: Any = None  # CUDA: the device the copies come from
        self.copies: dict[int, torch.Tensor] = {}
        self.error: BaseException | None = None
        self.seconds = 0.0  # the copy's own time, in the snapshot's thread
        self.waited: float | None = None  # what the training thread waited for it (None: nothing waited yet)

    def run(self) -> dict[str, Any]:
        """The snapshot's thread: every tensor copied (shared storage copied once); the tree with the copies."""
        started = time.perf_counter()
        try:
            try:
                if self.cuda:
                    self._queue()
                else:
                    self.copies = self._copy_each(lambda t: t.to("cpu", copy=True))
            finally:
                self.issued.set()  # the training thread never waits for a copy that failed
            if self.done is not None:
                self.done.synchronize()
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self.complete.set()  # nor does the checkpoint writer
        self.seconds = time.perf_counter() - started
        tree, self.tree, self.sources, self.copies = _replace(self.tree, self.copies), {}, [], {}
        return dict(tree)

    def _queue(self) -> None:
        """CUDA: pinned host buffers, filled on a side stream after the step's kernels; the copies' event."""
        self.device = next(t.device for t in self.sources if t.is_cuda)
        torch.cuda.set_device(self.device)
        side = torch.cuda.Stream(self.device)
        with torch.cuda.stream(side):
            side.wait_event(self.ready)
            self.copies = self._copy_each(lambda t: torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
                                          .copy_(t, non_blocking=True))
            self.done = torch.cuda.Event()
            self.done.record(side)

    def _copy_each(self, copy_one: Any) -> dict[int, torch.Tensor]:
        copies: dict[int, torch.Tensor] = {}
        for tensor in self.sources:
            key = tensor_key(tensor)
            if key not in self.by_place:
                self.by_place[key] = copy_one(tensor)
            copies[id(tensor)] = self.by_place[key]
        return copies

    def wait(self) -> float:
        """The training thread, before the state changes: wait for the copy (CUDA: until it is queued, then the
        training stream waits on it); the seconds waited, recorded the first time."""
        if self.waited is not None:
            return 0.0
        started = time.perf_counter()
        self.issued.wait()
        if self.done is not None:
            torch.cuda.current_stream(self.device).wait_event(self.done)
        self.waited = time.perf_counter() - started
        return self.waited

    # ---- the checkpoint's staging, from the same copy -------------------------------------------------------
    def serve(self, shards: dict[str, Any]) -> Callable[[], dict[str, Any]] | None:
        """The training thread, at a commit that also writes a sharded checkpoint: ``shards`` (its state dicts, of
        the same live tensors) laid out now, to be filled from this copy in the checkpoint writer's thread (the call
        returned; it waits for the copy). None where a tensor of ``shards`` is not in this copy (then the writer
        stages its own)."""
        slots = _slots(shards, self.keys)
        if slots is None:
            return None
        return lambda: dict(_fill(slots, self.result()))

    def result(self) -> dict[tuple[Any, ...], torch.Tensor]:
        """Each live tensor's copy by where its bytes are, once made (any thread but the training one)."""
        self.complete.wait()
        if self.error is not None:
            raise RuntimeError(f"the host copy of step {self.step}'s snapshot failed: {self.error}")
        return self.by_place


class _Slot:
    """Where a copied tensor goes in a checkpoint's state dict: its bytes' place, and a DTensor's sharding."""

    def __init__(self, key: tuple[Any, ...], spec: Any) -> None:
        self.key, self.spec = key, spec


class _NotCopied(Exception):
    """A tensor of the checkpoint's state is not in the snapshot's copy."""


def _slots(tree: Any, keys: set[tuple[Any, ...]]) -> Any:
    """``tree`` with every tensor a ``_Slot`` (None if one is not among ``keys``), the rest copied now."""
    def lay(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            key = tensor_key(value)
            if key not in keys:
                raise _NotCopied
            return _Slot(key, getattr(value, "_spec", None) if hasattr(value, "to_local") else None)
        if isinstance(value, dict):
            return {k: lay(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(lay(v) for v in value)
        return copy.deepcopy(value)

    try:
        return lay(tree)
    except _NotCopied:
        return None


def _fill(tree: Any, copies: dict[tuple[Any, ...], torch.Tensor]) -> Any:
    """The slots of ``_slots`` filled with the copies (a DTensor's: a DTensor of the same sharding, its local part
    in host memory, as the checkpoint's own stager makes it)."""
    from torch.distributed.tensor import DTensor

    if isinstance(tree, _Slot):
        host = copies[tree.key]
        return host if tree.spec is None else DTensor(host, tree.spec, requires_grad=False)
    if isinstance(tree, dict):
        return {k: _fill(v, copies) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_fill(v, copies) for v in tree)
    return tree
