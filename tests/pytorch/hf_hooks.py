"""A transformers causal LM (GPT-2 style, tiny) fine-tuned in hooks mode: what the Hugging Face tests run.

``--config DIR``: the pretrained model's directory (its ``config.json``; the weights come from ``--init-from``).
``--lr``: the learning rate (0: the exported weights are the pretrained ones exactly). The data are random token
windows made here, from a seed (nothing is downloaded). No ``eval_step``: the evaluation follows ``compute_loss``.
``DEFAULTS["max_shard_size"]`` is small, so the export is cut into several files with an index, as the hub's are.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

DEFAULTS = {"epochs": 1, "batch_size": 4, "max_shard_size": 20_000}
TOKENS = 12


class Windows(Dataset[torch.Tensor]):
    """``n`` random token windows of the model's vocabulary."""

    def __init__(self, n: int, vocab: int, seed: int) -> None:
        self.data = torch.randint(vocab, (n, TOKENS), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True)
    parser.add_argument("--lr", type=float, default=0.0)
    parser.add_argument("--samples", type=int, default=16)


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[Windows, Windows]:
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(args.config).vocab_size
    return Windows(args.samples, vocab, 1), Windows(8, vocab, 2)


def build_model(args: argparse.Namespace, ctx: Any) -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.config))  # type: ignore[no-any-return]


def build_optimizer(model: nn.Module, args: argparse.Namespace, ctx: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=args.lr)


def compute_loss(model: nn.Module, batch: torch.Tensor, ctx: Any) -> torch.Tensor:
    return model(input_ids=batch, labels=batch).loss  # type: ignore[no-any-return]
