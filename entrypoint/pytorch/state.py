"""Save and restore the full training state (model, optimizer, scheduler, step, RNG of every rank)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from entrypoint import checkpoints

STATE_FILE = "state.pt"


def rng_state() -> dict[str, Any]:
    """This process's random generator states."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore generator states saved by ``rng_state``."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(path: Path, state: dict[str, Any], meta: dict[str, Any]) -> None:
    """Write the state file, then the commit marker (last)."""
    path.mkdir(parents=True, exist_ok=True)
    torch.save(state, path / STATE_FILE)
    checkpoints.commit(path, meta)


def load(path: Path, device: torch.device) -> dict[str, Any]:
    """Load a committed checkpoint's state onto ``device``."""
    state: dict[str, Any] = torch.load(path / STATE_FILE, map_location=device, weights_only=False)
    return state
