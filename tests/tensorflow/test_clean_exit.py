"""A successful MultiWorkerMirrored job logs no error: its replicas leave together, the chief last."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.tensorflow.runs import local_command, run_args, run_job, tail

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]
# TensorFlow's own error-level lines (glog "E0000 ...") and its collective executor's abort; the CPU wheel's failed
# CUDA probe (cuInit on a machine without a GPU driver) is the one error line TensorFlow prints at import there.
ERROR_LINE = re.compile(r"(\] |^)E\d{4} |StartAbort|tasks have crashed|\bERROR\b|Traceback|entrypoint: error")


def error_lines(text: str) -> list[str]:
    """Lines of a successful job that look like errors (TensorFlow's CUDA probe on a CPU-only machine aside)."""
    return [line for line in text.splitlines() if ERROR_LINE.search(line) and "cuInit" not in line]


def test_a_chief_that_works_on_after_its_workers_logs_no_abort(tmp_path: Path) -> None:
    out, late = tmp_path / "out", 15  # longer than the coordination service's heartbeat timeout (10 s)
    command = local_command(tmp_path / "job", "--workers", "3", run=run_args(
        "--script", "tests/tensorflow/late_chief_task.py", "--", str(out), str(late)))
    proc = run_job(command, ROOT)
    assert proc.returncode == 0, tail(proc)
    finished = {p.stem: json.loads(p.read_text())["time"] for p in out.glob("*.json")}
    assert sorted(finished) == ["chief-0", "worker-0", "worker-1"]
    # The chief worked on after its workers were done: measured from the first worker's write, as a loaded machine
    # delays the other's by seconds (13.0 s between the chief's and the later worker's in a fresh run).
    assert finished["chief-0"] >= min(finished["worker-0"], finished["worker-1"]) + late * 0.9, finished
    assert error_lines(proc.stdout + proc.stderr) == [], tail(proc)
