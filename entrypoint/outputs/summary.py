"""The training summary every loop writes beside the exported model: one versioned schema (docs/OUTPUTS.md)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from entrypoint.outputs import storage
from entrypoint.outputs.checkpoints import fenced
from entrypoint.outputs.storage import Location

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
    recoveries: list[dict[str, Any]] = field(default_factory=list)  # one per resume after a failure (lost_work.py)
    goodput: dict[str, Any] = field(default_factory=dict)  # the job's goodput so far (outputs/goodput/__init__.py)
    image: dict[str, Any] = field(default_factory=dict)  # the image it ran: reference, digest, SBOM's sha256 (sbom.py)
    schema_version: int = SCHEMA_VERSION


def strict(value: Any) -> Any:
    """``value`` made strict JSON: NaN and infinities become null (``json`` would write bare ``NaN``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # a numpy or torch scalar
        return strict(value.item())
    return value


def write_summary(model_dir: str | Location, summary: TrainingSummary) -> Location:
    """Write ``training_summary.json`` into ``model_dir`` (strict JSON: a non-finite number is null; one object)."""
    path = storage.path(model_dir) / SUMMARY_FILE
    fenced()  # a job whose job dir another job took over writes no summary (checkpoints.fence)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(strict(asdict(summary)), indent=2, sort_keys=True, allow_nan=False))
    return path
