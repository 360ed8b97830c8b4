"""TensorFlow and gs:// without Vertex's FUSE mount: the hooks loop refuses it in one line (exit 2).

TensorFlow's own GCS file system (in the 2.21 wheel) has its endpoint compiled in
(``https://www.googleapis.com/storage/v1/``) and no variable to point it at an emulator, so TensorFlow's
writes to gs:// cannot be tested here; the hooks loop writes Cloud Storage only through the /gcs mount.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.jobs import entrypoint, failure_text, last_line

pytest.importorskip("tensorflow")
pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]


def test_the_tensorflow_hooks_loop_refuses_gcs_without_the_mount(tmp_path: Path) -> None:
    if os.path.ismount("/gcs"):
        pytest.skip("this machine has a /gcs mount")
    proc = entrypoint("run", "--framework", "tensorflow", "--module", "tests.tensorflow.toy_hooks", "--job-dir",
                      "gs://bucket-canary-7f1c/job", env={"TMPDIR": str(tmp_path), "STORAGE_EMULATOR_HOST": ""})
    assert proc.returncode == 2, failure_text(proc)
    line = last_line(proc)
    assert line.startswith("entrypoint: error: config") and "--job-dir: gs://bucket-canary-7f1c/job: the TensorFlow " \
        "hooks loop writes Cloud Storage only through Vertex's FUSE mount at /gcs" in line, line
    assert list((tmp_path / "trainer-failures").glob("*.json"))  # the record went to the node's temp dir
