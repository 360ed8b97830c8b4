"""The TensorFlow hooks loop's start-up has its own limit: a ``build_model`` slower than ``--startup-timeout`` ends
the replica with the permanent 124, its last line naming the phase and the flag (``--hang-timeout`` starts at the
first step: a small one never fires while building)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from entrypoint.failures.records import read_records
from tests.conftest import PYTHON, ROOT, skip_unless_installed
from tests.tensorflow.runs import SLOW, run_args, run_job, tail

skip_unless_installed("tensorflow")
pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]


def test_a_build_model_past_the_startup_timeout_ends_permanently_naming_the_phase(tmp_path: Path) -> None:
    # The start-up clock starts once the strategy exists: 20 s leaves a loaded machine room to reach build_model.
    command = [PYTHON, "-m", "entrypoint", *run_args("--module", SLOW, "--job-dir", str(tmp_path),
                                                     "--startup-timeout", "20", "--hang-timeout", "1", "--",
                                                     "--build-sleep", "3600")]
    proc = run_job(command, ROOT)
    assert proc.returncode == 124, tail(proc)
    output = proc.stdout + proc.stderr
    assert "build_model: sleeping 3600 s" in output and re.search(r"line \d+ in build_model", output), tail(proc)
    last = output.strip().splitlines()[-1]
    assert last.startswith("entrypoint: error: startup_timeout on "), last
    assert "still building the model (build_model) after 20 s (--startup-timeout); raise --startup-timeout" in last
    assert last.endswith("(exit 124, permanent)"), last
    assert [r.failure_class for r in read_records(str(tmp_path), 0)] == ["startup_timeout"]
