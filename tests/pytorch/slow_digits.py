"""The digits example with a pause per step, so a test can kill the job mid-training."""

from __future__ import annotations

import time
from typing import Any

import torch.nn.functional as F
from torch import nn

from trainers.digits_torch import DEFAULTS, add_arguments, build_datasets, build_model, build_optimizer

__all__ = ["DEFAULTS", "add_arguments", "build_datasets", "build_model", "build_optimizer", "compute_loss"]


def compute_loss(model: nn.Module, batch: Any, ctx: Any) -> Any:
    """Cross-entropy, 50 ms slower than it needs to be."""
    time.sleep(0.05)
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)
