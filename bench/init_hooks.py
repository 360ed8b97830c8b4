"""The memory benchmark's pretrained-weights jobs: ``bench.gpt``'s GPT loaded from a safetensors checkpoint under FSDP.

    python -m entrypoint run --framework pytorch --module bench.init_hooks --nproc-per-node 2 --strategy fsdp \
        --init-from DIR -- --config 1b                     # each rank reads its shards after sharding
    python -m entrypoint run ... --strategy fsdp -- --config 1b --load DIR   # every rank loads all in build_model

``--load DIR`` is the way without ``--init-from``: ``build_model`` builds the whole model and reads the whole
checkpoint into it (with the entrypoint's own reader, so only where the loading happens differs), then the model
is sharded. With ``BENCH_PID_DIR`` set, every training process writes ``$BENCH_PID_DIR/<pid>`` (JSON: its rank,
its resident set before ``build_model``, and its peak resident set, ``VmHWM``, at its first step: the loading's
peak). One step of one short window, SGD at learning rate 0, and no export keep the rest cheap.

``python -m bench.init_hooks save --config NAME DIR`` writes the checkpoint (``DIR/model.safetensors``) first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from bench.gpt import GPT, GPTConfig
from bench.gpt_hooks import status_mib

DEFAULTS = {"epochs": 1, "batch_size": 1}
TOKENS = 8  # one short window a step: the step is not what is measured
# ~1B parameters (18 GPT-2 style blocks of width 2048, a 32k vocabulary tied to the head), and a few MB to check the
# path at the quick size.
CONFIGS = {
    "quick": GPTConfig(block_size=TOKENS, vocab_size=2048, n_layer=2, n_head=4, n_embd=256),
    "1b": GPTConfig(block_size=TOKENS, vocab_size=32000, n_layer=18, n_head=16, n_embd=2048),
}
_state: dict[str, Any] = {"recorded": False}


class Windows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``n`` fixed token windows (inputs and targets)."""

    def __init__(self, n: int, vocab: int) -> None:
        self.data = torch.randint(vocab, (n, TOKENS + 1), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[i, :-1], self.data[i, 1:]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", choices=sorted(CONFIGS), default="quick")
    parser.add_argument("--load", default="", help="load this checkpoint in build_model (the way without --init-from)")


def build_datasets(args: argparse.Namespace, ctx: Any) -> tuple[Windows, Windows]:
    vocab = CONFIGS[args.config].vocab_size
    _state["before_mib"] = status_mib("VmRSS")
    return Windows(ctx.world_size, vocab), Windows(ctx.world_size, vocab)


def build_model(args: argparse.Namespace, ctx: Any) -> nn.Module:
    model = GPT(CONFIGS[args.config])
    if args.load:
        from entrypoint.pytorch.loop import pretrained

        pretrained.load(model, args.load)
    return model


def build_optimizer(model: nn.Module, args: argparse.Namespace, ctx: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.0)


def compute_loss(model: nn.Module, batch: Any, ctx: Any) -> torch.Tensor:
    where = os.environ.get("BENCH_PID_DIR")
    if where and not _state["recorded"]:
        _state["recorded"] = True
        (Path(where) / str(os.getpid())).write_text(json.dumps({
            "rank": ctx.rank, "before_mib": _state["before_mib"], "train_peak_mib": status_mib("VmHWM")}))
    x, y = batch
    loss: torch.Tensor = model(x, y)
    return loss


def eval_step(model: nn.Module, batch: Any, ctx: Any) -> dict[str, torch.Tensor]:
    x, y = batch
    return {"loss": model(x, y).float(), "count": torch.tensor(1.0)}


def export(model: nn.Module, model_dir: Path, ctx: Any) -> None:
    """Nothing: the benchmark measures the loading."""


def save(config: str, target: Path) -> int:
    """A randomly initialised GPT of ``config`` as ``target/model.safetensors`` (streamed); its bytes."""
    from entrypoint.pytorch.loop.export import write_safetensors

    torch.manual_seed(0)
    model = GPT(CONFIGS[config])
    state = model.state_dict()
    target.mkdir(parents=True, exist_ok=True)
    write_safetensors(state, target / "model.safetensors", True)
    return sum(p.numel() * p.element_size() for p in model.parameters())


if __name__ == "__main__":  # python -m bench.init_hooks save --config NAME DIR
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["save"])
    parser.add_argument("--config", choices=sorted(CONFIGS), required=True)
    parser.add_argument("dir")
    ns = parser.parse_args()
    print(json.dumps({"model_bytes": save(ns.config, Path(ns.dir))}))
    sys.exit(0)
