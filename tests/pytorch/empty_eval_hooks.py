"""The digits hooks with an empty evaluation set (the test of the warning that names it)."""

from __future__ import annotations

import argparse
from typing import Any

from torch.utils.data import Subset

from trainers import digits_torch

DEFAULTS = {"epochs": 2, "batch_size": 32}
add_arguments = digits_torch.add_arguments
build_model = digits_torch.build_model


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[Any, Any]:
    train, val = digits_torch.build_datasets(args, ctx)
    return train, Subset(val, [])
