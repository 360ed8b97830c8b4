"""Every horovod.tensorflow.keras callback in an unchanged Horovod Keras example, across two emulated replicas.

Horovod 0.28.1 takes these callbacks' backend from a bare `import keras` (Keras 3); build_horovod_wheel.sh
patches it to tf.keras's (tf-keras here), without which the example dies at the end of its first epoch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import skip_unless_installed
from tests.horovod.keras_callbacks_check import SCRIPT, check_callbacks
from tests.runs import entrypoint, failure_text

skip_unless_installed("horovod", "tensorflow")  # horovod.tensorflow.keras: the example imports it
pytestmark = [pytest.mark.horovod, pytest.mark.slow]


def test_every_horovod_keras_callback_works_in_an_unchanged_example(tmp_path: Path) -> None:
    out = tmp_path / "keras"
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(tmp_path / "job"), "--", "run",
                      "--framework", "horovod", "--timeout", "120", "--script", SCRIPT, "--", "--out", str(out),
                      timeout=600)
    assert proc.returncode == 0, failure_text(proc)
    check_callbacks(json.loads((out / "callbacks.json").read_text()), out)
