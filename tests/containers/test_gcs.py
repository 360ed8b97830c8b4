"""The PyTorch image writing gs:// without a FUSE mount, to a real GCS JSON API server on this machine.

The image's own gcsfs writes through ``STORAGE_EMULATOR_HOST`` (the container shares the host's network,
as every test container does); nothing is mounted for the outputs. The container is stopped mid-training
as an orchestrator stops it (SIGTERM through tini): the chief commits its checkpoint on the bucket, the
preemption record goes to the bucket, and the same container started again resumes from the bucket.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from entrypoint.outputs import checkpoints
from entrypoint.outputs.storage import RemotePath
from tests.conftest import ROOT, skip_unless_installed
from tests.containers.engine import PROGRESS, Container, started
from tests.containers.test_preemption import TRAIN, logged_steps, stop
from tests.gcs import BUCKET, Emulator

skip_unless_installed("gcsfs", "gcp_storage_emulator")
pytestmark = pytest.mark.containers




def test_a_stopped_container_commits_to_gcs_and_its_restart_resumes_from_there(
        engine: Any, built: Any, emulator: Emulator, tmp_path: Path) -> None:
    out = f"gs://{BUCKET}/container"
    container = Container(engine, built("pytorch"), [*TRAIN, "--job-dir", out], env=emulator.env,
                          volumes={ROOT / "tests": "/app/tests:ro"})
    with started(container, logs=tmp_path) as (job,):
        job.wait_for_output(PROGRESS)
        code, _ = stop(engine, job)
        assert code == 143, job.tail()
        assert f"job dir {out} (Cloud Storage through gcsfs, the GCS emulator at {emulator.host})" in job.output()
        saved = checkpoints.committed(f"{out}/checkpoints", warn=False)
        assert saved, f"no committed checkpoint on the bucket after the stop\n{job.tail()}"
        resume_step = saved[-1][0]
        assert resume_step >= max(logged_steps(job))
        records = [json.loads(p.read_text()) for p in RemotePath(f"{out}/failures").glob("*.json")]
        assert records and {r["class"] for r in records} == {"preempted"}, records
        restart = subprocess.run(engine.command("start", "--attach", job.name), capture_output=True, text=True,
                                 timeout=600, check=False)
        assert restart.returncode == 0, restart.stdout[-3000:] + restart.stderr[-3000:]
        assert f"resumed from {out}/checkpoints/ckpt-{resume_step:08d} at step {resume_step}" in \
            restart.stdout + restart.stderr
    summary = json.loads(RemotePath(f"{out}/model/training_summary.json").read_text())
    assert summary["start_step"] == resume_step and summary["final_step"] == summary["expected_steps"]
    for _step, path in checkpoints.committed(f"{out}/checkpoints"):
        checkpoints.verify(path)  # every committed checkpoint on the bucket is whole
    assert (RemotePath(f"{out}/model") / "model.pt").exists()
