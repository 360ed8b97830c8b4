"""Platform settings that are not cluster layout: image defaults, output dirs, GPUs, secrets' names."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from entrypoint import envvars as ev

_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSW(OR)?D|CREDENTIAL|PRIVATE|AUTH)", re.IGNORECASE)


@dataclass(frozen=True)
class PlatformSettings:
    """What the image and the platform configured besides the cluster: defaults for the CLI."""

    framework: str | None = None
    module: str | None = None
    model_dir: str | None = None
    checkpoint_dir: str | None = None
    tensorboard_dir: str | None = None
    job_dir: str | None = None
    cuda_visible_devices: str | None = None
    metric_file: str | None = None
    horovod_tuning: tuple[tuple[str, str], ...] = ()  # HOROVOD_FUSION_THRESHOLD & co. the user set
    tf_use_legacy_keras: str | None = None  # the user's own choice, if any


def read_settings(environ: Mapping[str, str] | None = None) -> PlatformSettings:
    """Read TRAINER_*, AIP_* and CUDA_VISIBLE_DEVICES (empty strings count as unset)."""
    env = os.environ if environ is None else environ

    def get(name: str) -> str | None:
        value = env.get(name, "").strip()
        return value or None

    return PlatformSettings(
        framework=get(ev.TRAINER_FRAMEWORK),
        module=get(ev.TRAINER_MODULE),
        model_dir=get(ev.AIP_MODEL_DIR),
        checkpoint_dir=get(ev.AIP_CHECKPOINT_DIR),
        tensorboard_dir=get(ev.AIP_TENSORBOARD_LOG_DIR),
        job_dir=get(ev.TRAINER_JOB_DIR),
        cuda_visible_devices=env.get(ev.CUDA_VISIBLE_DEVICES),
        metric_file=get(ev.CLOUD_ML_HP_METRIC_FILE),
        horovod_tuning=tuple(sorted(user_overrides(ev.HOROVOD_TUNING, env).items())),
        tf_use_legacy_keras=get(ev.TF_USE_LEGACY_KERAS),
    )


def user_overrides(names: tuple[str, ...], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The subset of ``names`` the user set explicitly (their values always win over our defaults)."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in names if env.get(name, "").strip()}


def secret_like_names(environ: Mapping[str, str] | None = None) -> list[str]:
    """Names (never values) of variables that look like keys, tokens, passwords or credentials."""
    env = os.environ if environ is None else environ
    return sorted(name for name in env if _SECRET_NAME.search(name))
