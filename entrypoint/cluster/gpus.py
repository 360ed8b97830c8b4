"""Count GPUs without importing any ML framework (CUDA_VISIBLE_DEVICES, nvidia-smi, /proc)."""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache

_HIDDEN = {"", "-1", "none", "nodevfiles", "void"}


def detect_gpu_count(cuda_visible_devices: str | None) -> int:
    """Visible NVIDIA GPUs on this node: CUDA_VISIBLE_DEVICES if set, else what the driver lists."""
    if cuda_visible_devices is not None:
        count = 0
        for item in cuda_visible_devices.split(","):
            if item.strip().lower() in _HIDDEN:
                break  # CUDA stops at the first invalid entry
            count += 1
        return count
    return driver_gpu_count()


@cache  # nvidia-smi takes a while; the GPUs do not change
def driver_gpu_count() -> int:
    """GPUs the NVIDIA driver lists (``nvidia-smi -L``, else /proc/driver/nvidia/gpus); 0 without a driver."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired):
            out = None
        if out is not None and out.returncode == 0:
            return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    proc = "/proc/driver/nvidia/gpus"
    return len(os.listdir(proc)) if os.path.isdir(proc) else 0
