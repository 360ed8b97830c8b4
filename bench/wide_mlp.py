"""A wide MLP on synthetic data: enough gradient bytes per step for bucketing and fusion to matter."""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

DEFAULTS = {"epochs": 1, "batch_size": 64}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Width and depth of the model, size of the synthetic set."""
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--samples", type=int, default=8192)


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[TensorDataset, TensorDataset]:
    """Random inputs with a learnable labelling."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, 256, generator=g)
    y = (x[:, :10].argmax(dim=1)).long()
    return TensorDataset(x, y), TensorDataset(x[:512], y[:512])


def build_model(args: argparse.Namespace, ctx: Any) -> nn.Module:
    """``depth`` hidden layers of ``width`` units (~6M parameters by default)."""
    layers: list[nn.Module] = [nn.Linear(256, args.width), nn.ReLU()]
    for _ in range(args.depth - 1):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(args.width, 10))
