"""The platform's advance notice under the Keras loop: named in the log (no early save there), and the job trains on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT
from tests.metadata import FakeMetadata
from tests.tensorflow.runs import SLOW, run_args, run_job, tail

pytestmark = pytest.mark.tensorflow


def test_a_reclaim_notice_is_named_and_training_goes_on(tmp_path: Path) -> None:
    with FakeMetadata() as server:
        server.values["instance/preempted"] = "TRUE"  # announced already when training starts
        proc = run_job([PYTHON, "-m", "entrypoint", *run_args("--module", SLOW, "--job-dir", str(tmp_path),
                                                              "--epochs", "1")],
                       ROOT, env={"GCE_METADATA_HOST": server.host})
    assert proc.returncode == 0, tail(proc)
    assert re.search(r"advance notice from the platform: preempted \(instance/preempted\) on node-0: the TensorFlow "
                     r"loop commits no checkpoint early", proc.stdout), tail(proc)
    assert (tmp_path / "model" / "training_summary.json").exists()
    assert server.refused == 0
