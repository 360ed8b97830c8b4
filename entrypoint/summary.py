"""The training summary every loop writes beside the exported model: one versioned schema (docs/OUTPUTS.md)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
SUMMARY_FILE = "training_summary.json"


@dataclass
class TrainingSummary:
    """What a finished training did, identical in shape for every framework."""

    framework: str
    strategy: str
    backend: str  # gloo | nccl | horovod | ring | parameter_servers | local
    device: str
    world_size: int  # training processes
    replicas_in_sync: int  # data-parallel replicas (TensorFlow: every GPU of every worker)
    global_batch_size: int
    epochs: int
    start_epoch: int  # > 0 after a resume
    start_step: int  # the step this run resumed from (0 for a fresh start)
    final_step: int
    expected_steps: int | None  # epochs x steps per epoch, when known
    steps_per_replica: list[int]  # steps each replica trained in this run
    metrics: dict[str, float]  # the final evaluation
    history: dict[str, list[float]]  # per-epoch metrics
    seconds: float
    samples_per_second: float
    checkpoint_blocked_seconds: float  # training time spent waiting for checkpoints, summed over the run
    checkpoint_write_seconds: float  # time spent writing them (in the background when asynchronous)
    trial: str | None
    hypertune_file: str | None
    load_with: str  # how to load the export back
    ranks: list[int] = field(default_factory=list)
    param_digests: list[str] = field(default_factory=list)  # per rank: equal when replicas are in sync
    details: dict[str, Any] = field(default_factory=dict)  # framework-specific extras
    schema_version: int = SCHEMA_VERSION


def write_summary(model_dir: Path, summary: TrainingSummary) -> Path:
    """Write ``training_summary.json`` into ``model_dir``."""
    path = model_dir / SUMMARY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(summary), indent=2, sort_keys=True, default=float))
    return path
