"""A small GPT in the hooks style: the entrypoint picks DDP or FSDP by the model's size, or by --strategy.

Learns a synthetic language generated here (a fixed random Markov chain over a small vocabulary, so the loss
has a known floor), with the architecture of nanoGPT: token and position embeddings, pre-norm blocks of causal
self-attention and an MLP, a final LayerNorm and a head tied to the token embedding. Each block is one FSDP
shard unit (the entrypoint's default: the repeated blocks of ``self.blocks``). Launch on one node, sharded:

    python -m entrypoint run --framework pytorch --module trainers.gpt_torch --strategy fsdp --nproc-per-node 2

on a 2-replica emulated Vertex cluster: ``python -m entrypoint local --workers 2 -- run --framework pytorch
--module trainers.gpt_torch --strategy fsdp``; the model is exported as ``model.safetensors``.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

DEFAULTS = {"epochs": 2, "batch_size": 8}
HYPERTUNE_METRIC = "loss"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Model size, data size and optimizer (everything after ``--`` on the command line)."""
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--block", type=int, default=32, help="context length")
    parser.add_argument("--width", type=int, default=64, help="embedding width")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--windows", type=int, default=512, help="training windows per epoch")
    parser.add_argument("--lr", type=float, default=3e-3)


class MarkovText(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``count`` windows of a text drawn from a fixed random Markov chain: (tokens, next tokens)."""

    def __init__(self, vocab: int, block: int, count: int, seed: int) -> None:
        g = torch.Generator().manual_seed(1234)  # the language: the same for every split
        logits = torch.randn(vocab, vocab, generator=g) * 3
        chain = torch.softmax(logits, dim=-1)
        g.manual_seed(seed)
        text = torch.empty(count + block + 1, dtype=torch.long)
        text[0] = 0
        for i in range(1, len(text)):
            text[i] = torch.multinomial(chain[text[i - 1]], 1, generator=g)
        self.text, self.block, self.count = text, block, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.text[i:i + self.block], self.text[i + 1:i + self.block + 1]


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Embeddings, ``layers`` blocks, a final LayerNorm and a head tied to the token embedding."""

    def __init__(self, vocab: int, block: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(block, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[MarkovText, MarkovText]:
    """Training and evaluation windows of the same language, from different stretches of text."""
    return (MarkovText(args.vocab, args.block, args.windows, seed=1),
            MarkovText(args.vocab, args.block, max(args.windows // 8, 1), seed=2))


def build_model(args: argparse.Namespace, ctx: Any) -> nn.Module:
    """The GPT (the entrypoint shards or replicates it, then places it on ``ctx.device``)."""
    return GPT(args.vocab, args.block, args.width, args.layers, args.heads)


def build_optimizer(model: nn.Module, args: argparse.Namespace, ctx: Any) -> torch.optim.Optimizer:
    """AdamW, no weight decay on biases and norms (nanoGPT's split)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=args.lr)


def compute_loss(model: nn.Module, batch: Any, ctx: Any) -> torch.Tensor:
    """Next-token cross-entropy."""
    x, y = batch
    loss: torch.Tensor = model(x, y)
    return loss


def eval_step(model: nn.Module, batch: Any, ctx: Any) -> dict[str, torch.Tensor]:
    """Summed loss and the window count (the loop all-reduces the sums and divides by ``count``)."""
    x, _ = batch
    count = torch.tensor(float(x.shape[0]), device=x.device)
    return {"loss": model(*batch).float() * count, "count": count}
