"""What hooks receive as ``ctx``, and what the loop does for the hooks a module leaves out (``eval_step`` follows the
module's own ``compute_loss`` where it has one)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from entrypoint.outputs.storage import Location


@dataclass
class HookContext:
    """What hooks receive as ``ctx``: ranks, device, output directories, and the chief flag."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    is_chief: bool
    model_dir: Location  # pathlib.Path, or storage.RemotePath for gs:// without Vertex's FUSE mount
    checkpoint_dir: Location
    tensorboard_dir: Location
    trial: str | None


def default_loss(model: nn.Module, batch: Any, ctx: HookContext) -> torch.Tensor:
    """Classification: ``batch = (inputs, labels)``, cross-entropy on the logits."""
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)


def default_eval_step(model: nn.Module, batch: Any, ctx: HookContext) -> dict[str, torch.Tensor]:
    """Sums for classification metrics; the loop all-reduces them and divides by ``count``."""
    inputs, labels = batch
    logits = model(inputs)
    return {
        "loss": F.cross_entropy(logits, labels, reduction="sum"),
        "accuracy": (logits.argmax(dim=-1) == labels).sum().float(),
        "count": torch.tensor(float(labels.shape[0]), device=labels.device),
    }


def batch_count(batch: Any) -> int:
    """The samples in a batch: the first dimension of its first tensor (in a tuple, list or dict); 1 without one."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else ()
    for item in items:
        if isinstance(item, (torch.Tensor, tuple, list, dict)):
            return batch_count(item)
    return 1


def classification_pair(batch: Any) -> bool:
    """Whether ``batch`` is ``(inputs, labels)`` with one integer label per sample (accuracy makes sense)."""
    return isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[1], torch.Tensor) and \
        batch[1].dim() == 1 and not batch[1].is_floating_point() and batch[1].dtype != torch.bool


def eval_step_from_loss(compute_loss: Callable[..., torch.Tensor]) -> Callable[..., dict[str, torch.Tensor]]:
    """The evaluation of a module that defines ``compute_loss`` but no ``eval_step``. A batch ``(inputs, labels)``
    with one integer label per sample keeps the classification metrics (``default_eval_step``: cross-entropy and
    accuracy, ``compute_loss`` not called, as before); any other batch (a language model's tokens, a dict), which
    that default cannot read, gets the module's own loss, averaged over the samples (each batch's mean loss
    weighted by its size)."""

    def eval_step(model: nn.Module, batch: Any, ctx: HookContext) -> dict[str, torch.Tensor]:
        if classification_pair(batch):
            return default_eval_step(model, batch, ctx)
        count = batch_count(batch)
        loss = compute_loss(model, batch, ctx).detach().float()
        return {"loss": loss * count, "count": torch.tensor(float(count), device=loss.device)}

    return eval_step


def param_digest(model: nn.Module) -> str:
    """A digest of every parameter's bytes on this rank (a sharded parameter's local shard): equal on every rank when
    replicas are in sync."""
    h = hashlib.sha256()
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        h.update(local.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]
