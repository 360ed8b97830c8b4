"""The digits example, but every rank initialises its model differently: Horovod must broadcast rank 0's."""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn

from trainers.digits_torch import DEFAULTS, add_arguments, build_datasets, build_optimizer
from trainers.digits_torch import build_model as digits_model

__all__ = ["DEFAULTS", "add_arguments", "build_datasets", "build_model", "build_optimizer"]


def build_model(args: argparse.Namespace, ctx: Any) -> nn.Module:
    """The digits MLP seeded with the rank."""
    torch.manual_seed(1000 + ctx.rank)
    return digits_model(args, ctx)
