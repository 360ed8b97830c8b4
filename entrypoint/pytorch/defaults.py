"""What hooks receive as ``ctx``, and what the loop does for the hooks a module leaves out."""

from __future__ import annotations

import hashlib
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


def param_digest(model: nn.Module) -> str:
    """A digest of every parameter's bytes: equal on every rank when replicas are in sync."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]
