"""A small GPT in the nanoGPT style, its synthetic corpus and its optimizer: shared by every loop we compare.

The hand-written loop (``bench.ddp_loop``) and the entrypoint's hooks loop (``bench.gpt_hooks``) both
build exactly this model, this data and this optimizer, so their throughputs compare like for like.
Nothing is downloaded: the corpus is a seeded random walk over the vocabulary (learnable, never stored).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    """Model shape (nanoGPT's names)."""

    block_size: int = 256
    vocab_size: int = 8192
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    dropout: float = 0.0
    bias: bool = False


# Named sizes: `tiny` runs anywhere in seconds, `cpu` is the CPU comparison, `100m` the sharded-training memory
# and checkpoint measurements on CPU (110M parameters, GPT-2 small's blocks with a 32k vocabulary and a short
# context: its 94 MiB token embedding is the largest tensor, 10x the next), `gpu` is a ~124M GPT-2 small, `700m`
# the MFU measurement on one big GPU (bench/gpu_checks.sh: GPT-2 small's depth at 2048 wide, 128-wide heads: 707M
# parameters, as wide as a 1B model while its 12 blocks still compile within a minute).
CONFIGS = {
    "tiny": GPTConfig(block_size=64, vocab_size=256, n_layer=2, n_head=2, n_embd=64),
    "cpu": GPTConfig(block_size=128, vocab_size=2048, n_layer=4, n_head=4, n_embd=128),
    "100m": GPTConfig(block_size=128, vocab_size=32000, n_layer=12, n_head=12, n_embd=768),
    "gpu": GPTConfig(block_size=1024, vocab_size=50304, n_layer=12, n_head=12, n_embd=768),
    "700m": GPTConfig(block_size=1024, vocab_size=50304, n_layer=12, n_head=16, n_embd=2048),
}


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``scaled_dot_product_attention`` (flash on GPU)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.n_head, self.dropout = cfg.n_head, cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    """The 4x GELU feed-forward block."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(cfg.n_embd, bias=cfg.bias), CausalSelfAttention(cfg)
        self.ln_2, self.mlp = nn.LayerNorm(cfg.n_embd, bias=cfg.bias), MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token + position embeddings, ``n_layer`` blocks, a final norm and a tied language-model head."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte, self.wpe = nn.Embedding(cfg.vocab_size, cfg.n_embd), nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean next-token cross-entropy of ``idx`` against ``targets`` (both ``[B, T]``)."""
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def num_params(self) -> int:
        """Parameters without the position embedding (nanoGPT's count for FLOPs)."""
        return sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6N plus attention (PaLM appendix B, as nanoGPT's estimate_mfu)."""
        cfg = self.cfg
        return 6.0 * self.num_params() + 12.0 * cfg.n_layer * cfg.n_embd * cfg.block_size


def configure_optimizer(model: nn.Module, lr: float = 6e-4, weight_decay: float = 0.1) -> torch.optim.Optimizer:
    """AdamW with decay on matrices only, fused on CUDA (nanoGPT's configure_optimizers)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    on_cuda = any(p.is_cuda for p in params)
    fused = on_cuda and "fused" in inspect.signature(torch.optim.AdamW).parameters
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), **({"fused": True} if fused else {}))


def corpus(vocab_size: int, tokens: int, seed: int = 1337) -> torch.Tensor:
    """A synthetic token stream: a random walk with steps 0..3 modulo the vocabulary (int64, on CPU)."""
    g = torch.Generator().manual_seed(seed)
    steps = torch.randint(0, 4, (tokens,), generator=g)
    return torch.cumsum(steps, 0) % vocab_size


def window(data: torch.Tensor, start: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets of the window at ``start``."""
    return data[start:start + block_size], data[start + 1:start + 1 + block_size]
