"""Per-epoch evaluation of the hooks loop: every rank evaluates its shard, the sums are all-reduced.

Every rank takes part in the same collectives whatever its shard holds: the metric names are agreed on before
the sums are reduced (a rank with an empty shard, when the evaluation set is smaller than the world, adds zeros),
and with a sharded model (``lockstep``), whose forward pass is itself a collective, every rank runs as many
forward passes as the rank with the most batches (the extra ones, on a batch of the set, count for nothing).

Every rank goes through as many rounds as the rank with the most batches (rank 0: the shards are dealt from it), and
after each round the loop's guard is called (``between``: it beats the hang watchdog and reads the stop vote at the
same round on every rank, so a stop abandons the evaluation everywhere at one batch); around the rounds
(``rounds``) a slow batch does not hold a stop either, where the layout allows it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.data import Dataset, Subset

from entrypoint.pytorch.defaults import HookContext
from entrypoint.pytorch.launch.collectives import Collectives
from entrypoint.pytorch.loop.data import make_loader, start, to_device

StepFn = Callable[..., dict[str, torch.Tensor]]
log = logging.getLogger("entrypoint.pytorch")


class Guard(Protocol):
    """What the loop's guard does around an evaluation (``StepGuard.evaluating``)."""

    def rounds(self) -> AbstractContextManager[None]:
        """Around the evaluation's rounds (a stop may end them where a batch is read or evaluated)."""

    def between(self, batch: int, batches: int) -> None:
        """Round ``batch`` of ``batches`` is done on this rank."""


def rounds(size: int, world_size: int, batch_size: int) -> int:
    """The most batches any rank evaluates of ``size`` samples: rank 0's (its shard is the largest)."""
    return -(-len(range(0, size, world_size)) // batch_size)


def check_evaluation_set(dataset: Dataset[Any], ctx: HookContext) -> None:
    """One warning on the chief when the evaluation set is empty: every epoch's metrics line, the summary's metrics
    and the tuning metric would be empty without a word."""
    if ctx.is_chief and len(dataset) == 0:  # type: ignore[arg-type]
        log.warning("the evaluation set (build_datasets' second dataset) is empty: no metrics after each epoch, none "
                    "in the training summary, and no tuning metric reported")


def evaluate(model: nn.Module, dataset: Dataset[Any], step_fn: StepFn, ctx: HookContext, comm: Collectives,
             batch_size: int, workers: int, autocast: Callable[[], AbstractContextManager[Any]],
             lockstep: bool = False, guard: Guard | None = None) -> dict[str, float]:
    """Metrics over this rank's shard (no padding), summed across ranks, divided by the summed ``count``."""
    size = len(dataset)  # type: ignore[arg-type]
    shard = Subset(dataset, range(ctx.rank, size, ctx.world_size))
    sums: dict[str, torch.Tensor] = {}
    model.eval()
    loader = make_loader(shard, batch_size, None, workers, ctx.device.type == "cuda", False)
    most, filler = rounds(size, ctx.world_size, batch_size), None
    with torch.no_grad(), autocast(), guard.rounds() if guard is not None else nullcontext():
        batches = start(loader)
        for index in range(most):
            batch = next(batches, None)
            if batch is not None:
                for key, value in step_fn(model, to_device(batch, ctx.device), ctx).items():
                    sums[key] = sums.get(key, torch.zeros((), device=ctx.device)) + value.detach().float()
            elif lockstep:  # a forward pass is a collective: this rank runs one on a batch of the set, for nothing
                filler = filler if filler is not None else next(iter(make_loader(
                    Subset(dataset, range(min(batch_size, size))), batch_size, None, 0, False, False)))
                step_fn(model, to_device(filler, ctx.device), ctx)
            if guard is not None:
                guard.between(index, most)
    model.train()
    keys = sorted({key for names in comm.gather_object(sorted(sums)) for key in names})
    vector = torch.stack([sums.get(k, torch.zeros((), device=ctx.device)) for k in keys]) if keys else \
        torch.zeros(0, device=ctx.device)
    totals = dict(zip(keys, comm.all_reduce_sum(vector).tolist(), strict=True))
    count = totals.pop("count", 1.0) or 1.0
    return {k: v / count for k, v in totals.items()}
