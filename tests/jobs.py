"""Run the entrypoint as a real process and read what the job wrote (shared by every framework's tests)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import PYTHON, ROOT, subprocess_env


def entrypoint(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m entrypoint ARGS`` from the repo root, output captured."""
    return subprocess.run([PYTHON, "-m", "entrypoint", *args], cwd=ROOT, env=subprocess_env(env),
                          capture_output=True, text=True, timeout=timeout)


def summary(model_dir: Path) -> dict[str, Any]:
    """The chief's training summary."""
    data: dict[str, Any] = json.loads((model_dir / "training_summary.json").read_text())
    return data


def hypertune_files(output: Path) -> list[Path]:
    """Every hypertune metrics file any replica wrote (each emulated replica has its own /tmp)."""
    return sorted(output.glob(".replicas/*/hypertune/output.metrics"))


def failure_text(proc: subprocess.CompletedProcess[str]) -> str:
    """The tail of a failed run's output for an assertion message."""
    return f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
