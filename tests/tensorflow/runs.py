"""Helpers for the TensorFlow tests: start real jobs, read their outputs, make a tiny image folder."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests import runs as jobs
from tests.conftest import PYTHON, ROOT, subprocess_env
from tests.runs import summary

__all__ = ["summary"]  # the chief's training summary, shared with the other frameworks' tests

TOY = "tests.tensorflow.toy_hooks"
SLOW = "tests.tensorflow.slow_hooks"
PROGRESS = re.compile(r"epoch \d+/\d+ step (\d+)/\d+ loss")
JOB_TIMEOUT = 240  # seconds; each job takes 10-30 s on 2 idle cores
LEFTOVER_PREFIXES = ("workertemp_", "tf-nonchief-save-")


def run_args(*extra: str) -> list[str]:
    """``run --framework tensorflow`` with a short collective timeout and quiet progress."""
    return ["run", "--framework", "tensorflow", "--timeout", "120", "--log-every", "1000", *extra]


def local_command(output: Path, *local_args: str, run: list[str]) -> list[str]:
    """``python -m entrypoint local ... --output-dir OUTPUT -- run ...``."""
    return [PYTHON, "-m", "entrypoint", "local", *local_args, "--output-dir", str(output), "--", *run]


def run_job(command: list[str], cwd: Path, env: dict[str, str] | None = None,
            timeout: float = JOB_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run a job to completion; its output is kept for the assertion message."""
    return subprocess.run(command, cwd=cwd, env=subprocess_env(env), capture_output=True, text=True, timeout=timeout)


def tail(proc: subprocess.CompletedProcess[str], lines: int = 60) -> str:
    """The end of a job's output, for assertion messages."""
    return "\n".join((proc.stdout + proc.stderr).splitlines()[-lines:])


def leftovers(root: Path) -> list[Path]:
    """Every non-chief save location left anywhere under ``root``."""
    return [p for p in root.rglob("*") if p.name.startswith(LEFTOVER_PREFIXES)]


def assert_loadable(model_dir: Path, features: int) -> None:
    """Load the export back with tf-keras in a fresh process and predict one row."""
    code = ("import sys, numpy as np, tf_keras; m = tf_keras.models.load_model(sys.argv[1]); "
            f"assert m.predict(np.zeros((1, {features}), 'float32'), verbose=0).shape[0] == 1")
    proc = subprocess.run([PYTHON, "-c", code, str(model_dir)], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, tail(proc)


def make_image_folder(root: Path, classes: int = 3, per_class: int = 10, size: int = 32) -> Path:
    """A tiny labelled image folder (class-coloured noise PNGs) without importing TensorFlow here."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for label in range(classes):
        folder = root / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            image = rng.integers(0, 60, size=(size, size, 3), dtype=np.uint8)
            image[:, :, label] += 150
            Image.fromarray(image).save(folder / f"{i}.png")
    return root


@dataclass
class Stopped:
    """A job signalled once its log showed a given step: how it ended."""

    code: int
    seconds: float  # from the signal to the exit
    last_logged: int  # the highest step a progress line showed
    output: str


def stop_at_step(command: list[str], cwd: Path, step: int, sig: int = signal.SIGTERM,
                 timeout: float = JOB_TIMEOUT) -> Stopped:
    """Start a job, send it ``sig`` once a progress line shows ``step`` or later, wait for its exit."""
    proc = subprocess.Popen(command, cwd=cwd, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    deadline, sent = time.monotonic() + timeout, None
    try:
        while sent is None and proc.poll() is None and time.monotonic() < deadline:
            if max(logged_steps(lines), default=0) >= step:
                proc.send_signal(sig)
                sent = time.monotonic()
            time.sleep(0.02)
        assert sent is not None, f"never saw step {step} (exit {proc.poll()}):\n" + "".join(lines[-60:])
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        seconds = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=10)
    return Stopped(code, seconds, max(logged_steps(lines), default=0), "".join(lines))


def logged_steps(lines: list[str]) -> list[int]:
    """The steps of every progress line in ``lines``."""
    return [int(m.group(1)) for line in list(lines) if (m := PROGRESS.search(line))]


def processes_with(marker: str) -> list[int]:
    """Processes whose command line carries ``marker``."""
    return jobs.processes_with(marker, "cmdline")
