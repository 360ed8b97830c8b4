"""The typed options of ``run`` and their defaults (the command line that fills them is ``runargs``)."""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass, field
from typing import Any

# Defaults shared by every framework's loop (a module's DEFAULTS dict overrides them; flags override both).
DEFAULT_EPOCHS = 1
DEFAULT_BATCH_SIZE = 32
DEFAULT_TIMEOUT = 300.0
# How long a stopping process gets before SIGKILL: longer than a checkpoint save, shorter than the
# platform's own grace (Kubernetes' default terminationGracePeriodSeconds is 30 s).
DEFAULT_GRACE_PERIOD = 25.0
DEFAULT_HANG_TIMEOUT = 1800.0
# The start-up (building the datasets and the model, the restore, the first step) gets its own limit: a dataset
# download or a large model's load can take long, and takes as long again on a retry.
DEFAULT_STARTUP_TIMEOUT = 1800.0
LOG_FORMATS = ("auto", "text", "json")


@dataclass(frozen=True)
class RunOptions:
    """Everything ``run`` accepts before ``--``; ``user_args`` is what follows it, unchanged."""

    framework: str | None = None
    module: str | None = None
    script: str | None = None
    model_dir: str | None = None
    checkpoint_dir: str | None = None
    tensorboard_dir: str | None = None
    job_dir: str | None = None
    nproc_per_node: int | None = None
    strategy: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    grace_period: float = DEFAULT_GRACE_PERIOD
    hang_timeout: float = DEFAULT_HANG_TIMEOUT
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    epochs: int | None = None
    batch_size: int | None = None
    log_every: int = 20
    checkpoint_every: int = 0
    keep_checkpoints: int = 3
    checkpoint_mode: str = "async"
    resume_from: str | None = None
    init_from: str | None = None  # first weights: a Hugging Face safetensors checkpoint (PyTorch hooks)
    on_nonfinite: str = "fail"
    hypertune_metric: str | None = None
    bf16: bool = False
    clip_grad_norm: float | None = None
    seed: int = 42
    data_workers: int | None = None
    log_format: str | None = None  # auto | text | json; None: $TRAINER_LOG_FORMAT, else auto
    fabric: str | None = None  # auto | off | gib | tcpxo | tcpx; None: $TRAINER_FABRIC, else auto (cluster/fabric.py)
    # The values of the flags a framework adds itself (registry ``Framework.flags``), by name, as given.
    framework_options: tuple[tuple[str, Any], ...] = ()
    user_args: tuple[str, ...] = field(default=())

    def framework_option(self, name: str, default: Any = None) -> Any:
        """The value of a framework's own flag (``fusion_threshold``), or ``default`` when not given."""
        return dict(self.framework_options).get(name, default)

    def to_dict(self) -> dict[str, Any]:
        """Every option, for the plan file."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunOptions:
        """Inverse of ``to_dict``."""
        return cls(**{**data, "user_args": tuple(data.get("user_args", ())),
                      "framework_options": tuple(tuple(pair) for pair in data.get("framework_options", ()))})


# Value checks for command-line flags (the shared ones in ``runargs`` and the frameworks' own).
def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (a deadline of inf or nan seconds is no deadline: waits are bounded)."""
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    value = float(text)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value
