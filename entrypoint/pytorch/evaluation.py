"""Per-epoch evaluation of the hooks loop: every rank evaluates its shard, the sums are all-reduced."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, Subset

from entrypoint.pytorch.collectives import Collectives
from entrypoint.pytorch.data import make_loader, to_device
from entrypoint.pytorch.defaults import HookContext


def evaluate(model: nn.Module, dataset: Dataset[Any], step_fn: Callable[..., dict[str, torch.Tensor]], ctx: HookContext,
             comm: Collectives, batch_size: int, workers: int,
             autocast: Callable[[], AbstractContextManager[Any]]) -> dict[str, float]:
    """Metrics over this rank's shard (no padding), summed across ranks, divided by the summed ``count``."""
    shard = Subset(dataset, range(ctx.rank, len(dataset), ctx.world_size))  # type: ignore[arg-type]
    sums: dict[str, torch.Tensor] = {}
    model.eval()
    loader = make_loader(shard, batch_size, None, workers, ctx.device.type == "cuda", False)
    with torch.no_grad(), autocast():
        for batch in loader:
            for key, value in step_fn(model, to_device(batch, ctx.device), ctx).items():
                sums[key] = sums.get(key, torch.zeros((), device=ctx.device)) + value.detach().float()
    model.train()
    keys = sorted(sums)
    vector = torch.stack([sums[k] for k in keys]) if keys else torch.zeros(0, device=ctx.device)
    totals = dict(zip(keys, comm.all_reduce_sum(vector).tolist(), strict=True))
    count = totals.pop("count", 1.0) or 1.0
    return {k: v / count for k, v in totals.items()}
