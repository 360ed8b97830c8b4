"""Shared entrypoint of the trainer images; ``entrypoint.context`` is the API for user scripts."""

from entrypoint.context import (
    checkpoint_dir,
    is_chief,
    local_rank,
    model_dir,
    preempted,
    rank,
    report_metric,
    tensorboard_dir,
    world_size,
)

__all__ = [
    "checkpoint_dir",
    "is_chief",
    "local_rank",
    "model_dir",
    "preempted",
    "rank",
    "report_metric",
    "tensorboard_dir",
    "world_size",
]
