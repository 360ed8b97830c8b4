"""Per-epoch evaluation of the hooks loop: every rank evaluates its shard, the sums are all-reduced.

Every rank takes part in the same collectives whatever its shard holds: the metric names are agreed on before
the sums are reduced (a rank with an empty shard, when the evaluation set is smaller than the world, adds zeros),
and with a sharded model (``lockstep``), whose forward pass is itself a collective, every rank runs as many
forward passes as the rank with the most batches (the extra ones, on a batch of the set, count for nothing).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, Subset

from entrypoint.pytorch.defaults import HookContext
from entrypoint.pytorch.launch.collectives import Collectives
from entrypoint.pytorch.loop.data import make_loader, to_device

StepFn = Callable[..., dict[str, torch.Tensor]]
log = logging.getLogger("entrypoint.pytorch")


def check_evaluation_set(dataset: Dataset[Any], ctx: HookContext) -> None:
    """One warning on the chief when the evaluation set is empty: every epoch's metrics line, the summary's metrics
    and the tuning metric would be empty without a word."""
    if ctx.is_chief and len(dataset) == 0:  # type: ignore[arg-type]
        log.warning("the evaluation set (build_datasets' second dataset) is empty: no metrics after each epoch, none "
                    "in the training summary, and no tuning metric reported")


def evaluate(model: nn.Module, dataset: Dataset[Any], step_fn: StepFn, ctx: HookContext, comm: Collectives,
             batch_size: int, workers: int, autocast: Callable[[], AbstractContextManager[Any]],
             lockstep: bool = False) -> dict[str, float]:
    """Metrics over this rank's shard (no padding), summed across ranks, divided by the summed ``count``."""
    size = len(dataset)  # type: ignore[arg-type]
    shard = Subset(dataset, range(ctx.rank, size, ctx.world_size))
    sums: dict[str, torch.Tensor] = {}
    model.eval()
    loader = make_loader(shard, batch_size, None, workers, ctx.device.type == "cuda", False)
    with torch.no_grad(), autocast():
        for batch in loader:
            for key, value in step_fn(model, to_device(batch, ctx.device), ctx).items():
                sums[key] = sums.get(key, torch.zeros((), device=ctx.device)) + value.detach().float()
        if lockstep and size:
            most = max(comm.gather_object(len(loader)))
            filler = next(iter(make_loader(Subset(dataset, range(min(batch_size, size))), batch_size, None, 0,
                                           False, False)))
            for _ in range(most - len(loader)):
                step_fn(model, to_device(filler, ctx.device), ctx)
    model.train()
    keys = sorted({key for names in comm.gather_object(sorted(sums)) for key in names})
    vector = torch.stack([sums.get(k, torch.zeros((), device=ctx.device)) for k in keys]) if keys else \
        torch.zeros(0, device=ctx.device)
    totals = dict(zip(keys, comm.all_reduce_sum(vector).tolist(), strict=True))
    count = totals.pop("count", 1.0) or 1.0
    return {k: v / count for k, v in totals.items()}
