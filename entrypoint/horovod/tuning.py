"""Horovod's tensor-fusion settings: our defaults, the command line, and the user's variables (which win)."""

from __future__ import annotations

from pathlib import Path

from entrypoint import envvars as ev
from entrypoint.options import RunOptions
from entrypoint.plan import HOROVOD_CYCLE_TIME_DEFAULT_MS, HOROVOD_FUSION_THRESHOLD_DEFAULT

TUNING_VARIABLES = (ev.HOROVOD_FUSION_THRESHOLD, ev.HOROVOD_CYCLE_TIME, ev.HOROVOD_AUTOTUNE, ev.HOROVOD_AUTOTUNE_LOG)


def fusion_env(options: RunOptions, user_set: dict[str, str], job_dir: str) -> dict[str, str]:
    """HOROVOD_FUSION_THRESHOLD / CYCLE_TIME (/ AUTOTUNE) for the workers; variables the user set always win."""
    threshold = options.fusion_threshold if options.fusion_threshold is not None else HOROVOD_FUSION_THRESHOLD_DEFAULT
    cycle = options.cycle_time_ms if options.cycle_time_ms is not None else HOROVOD_CYCLE_TIME_DEFAULT_MS
    env = {ev.HOROVOD_FUSION_THRESHOLD: str(threshold), ev.HOROVOD_CYCLE_TIME: f"{cycle:g}"}
    if options.autotune:
        env[ev.HOROVOD_AUTOTUNE] = "1"
        env[ev.HOROVOD_AUTOTUNE_LOG] = str(Path(job_dir) / "horovod_autotune.csv")
    env.update(user_set)
    return env
