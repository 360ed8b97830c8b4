"""The digits hooks with a dataset that notes which DataLoader worker read it (under ``<job dir>/loader-workers/``).

The doctor tests read that directory to see how many workers the loop really started (``main``: no workers).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, get_worker_info

from trainers import digits_torch

DEFAULTS = {"epochs": 1, "batch_size": 32}
add_arguments = digits_torch.add_arguments
build_model = digits_torch.build_model
build_optimizer = digits_torch.build_optimizer


class Noted(Dataset[Any]):
    """A dataset that touches ``<where>/<worker id>`` the first time each worker reads from it."""

    def __init__(self, inner: Any, where: Path) -> None:
        self.inner, self.where, self.seen = inner, where, False

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.seen:
            info = get_worker_info()
            self.where.mkdir(parents=True, exist_ok=True)
            (self.where / ("main" if info is None else str(info.id))).touch()
            self.seen = True
        item: tuple[torch.Tensor, torch.Tensor] = self.inner[index]
        return item


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[Dataset[Any], Dataset[Any]]:
    """The digits, noted by worker."""
    train, val = digits_torch.build_datasets(args, ctx)
    where = Path(ctx.model_dir).parent / "loader-workers"
    return Noted(train, where), val
