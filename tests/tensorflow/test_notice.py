"""The platform's advance notice under the Keras loop: the worker that heard it names it, every worker commits the
newest trained step at the next batch (one worker here: the first batch after training starts), and the job trains on
to its end. A notice in a validation pass, on one of two workers: tests/tensorflow/test_stops.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from entrypoint.outputs.checkpoints import checkpoint_path, read_marker
from tests.conftest import PYTHON, ROOT
from tests.metadata import FakeMetadata
from tests.tensorflow.runs import SLOW, run_args, run_job, tail

pytestmark = pytest.mark.tensorflow


def test_a_reclaim_notice_commits_the_step_at_once_and_training_goes_on(tmp_path: Path) -> None:
    with FakeMetadata() as server:
        server.values["instance/preempted"] = "TRUE"  # announced already when training starts
        proc = run_job([PYTHON, "-m", "entrypoint", *run_args("--module", SLOW, "--job-dir", str(tmp_path),
                                                              "--epochs", "1", "--keep-checkpoints", "5")],
                       ROOT, env={"GCE_METADATA_HOST": server.host})
    assert proc.returncode == 0, tail(proc)
    heard = (r"advance notice from the platform: preempted \(instance/preempted\) on node-0: every worker commits the "
             r"newest trained step at the next batch, and training goes on")
    assert re.search(heard, proc.stdout), tail(proc)
    committed = re.findall(r"advance notice from the platform: preempted \(instance/preempted\) on node-0: "
                           r"checkpoint of step (\d+) committed", proc.stdout)
    assert len(committed) == 1, tail(proc)  # once per notice
    step = int(committed[0])
    assert 1 <= step < 32  # mid-epoch: the epoch's own commit is at step 32
    marker = read_marker(checkpoint_path(tmp_path / "checkpoints", step))
    assert marker["notice"] == "preempted (instance/preempted) on node-0" and marker["batch"] == step
    assert (tmp_path / "model" / "training_summary.json").exists()
    assert server.refused == 0
