"""The digits hooks whose ``compute_loss`` raises ``RuntimeError(--message)`` at the second step.

The message may read like a network error (``timed out waiting``): it is still the user's own error.

``--log-secret NAME`` also logs ``repr()`` of the variable NAME through ``logging`` and puts it in the
message (``--message`` then is a prefix).
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

import torch.nn.functional as F
from torch import nn

from trainers.digits_torch import DEFAULTS, build_datasets, build_optimizer
from trainers.digits_torch import add_arguments as digits_arguments
from trainers.digits_torch import build_model as digits_model

__all__ = ["DEFAULTS", "add_arguments", "build_datasets", "build_model", "build_optimizer", "compute_loss"]
_state: dict[str, Any] = {"steps": 0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    digits_arguments(parser)
    parser.add_argument("--message", default="boom")
    parser.add_argument("--log-secret", default="")


def build_model(args: argparse.Namespace, ctx: Any) -> nn.Module:
    _state["args"] = args
    return digits_model(args, ctx)


def compute_loss(model: nn.Module, batch: Any, ctx: Any) -> Any:
    args = _state["args"]
    _state["steps"] += 1
    if _state["steps"] == 2:
        message = args.message
        if args.log_secret:
            value = os.environ[args.log_secret]
            logging.getLogger("user.tracker").error("cannot reach the tracker with config %r", {"token": value})
            logging.getLogger("user.tracker").warning("token=%r", value)
            message = f"{message} {value!r} {dict(token=value)}"
        raise RuntimeError(message)
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)
