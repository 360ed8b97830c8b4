"""Horovod (the PyTorch hooks loop over Horovod) writing gs:// through gcsfs to a real GCS JSON API server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entrypoint.outputs import checkpoints
from entrypoint.outputs.storage import RemotePath
from tests.conftest import skip_unless_installed
from tests.gcs import BUCKET, Emulator
from tests.runs import entrypoint, failure_text

pytest.importorskip("horovod.torch")
skip_unless_installed("gcsfs", "gcp_storage_emulator")
pytestmark = [pytest.mark.horovod, pytest.mark.slow]




def test_two_horovod_replicas_write_checkpoints_model_and_summary_to_gcs(emulator: Emulator, tmp_path: Path) -> None:
    out = f"gs://{BUCKET}/horovod"
    proc = entrypoint("local", "--workers", "2", "--output-dir", out, "--", "run", "--framework", "horovod",
                      "--timeout", "60", "--module", "tests.pytorch.faults", "--epochs", "2",
                      env={**emulator.env, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, failure_text(proc)
    found = checkpoints.committed(f"{out}/checkpoints")
    assert [step for step, _ in found] == [22, 44]
    for _step, path in found:
        checkpoints.verify(path)
    result = json.loads(RemotePath(f"{out}/model/training_summary.json").read_text())
    assert result["backend"] == "horovod" and result["world_size"] == 2 and result["final_step"] == 44
    assert RemotePath(f"{out}/model/model.pt").is_file()
    # TensorBoard wrote through gcsfs even though TensorFlow is installed here (its GCS ignores the emulator)
    assert any(p.name.startswith("events.out.tfevents") for p in RemotePath(f"{out}/logs").iterdir())
