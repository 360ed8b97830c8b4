"""/dev/shm in a real container: Docker's default 64 MiB against DataLoader workers (make image-test).

With `--shm-size 64m` the preflight warns, names the fix and caps --data-workers, and the job trains to the
end; with `--shm-size 1g` the same job keeps its four workers. `doctor` in the image says the same in one
line, reports the digest the job's spec passed and its bill of materials' hash, and imports no framework. The
hooks module notes which DataLoader worker read the data
(tests/pytorch/loader_workers.py, mounted read-only on the image's PYTHONPATH).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.containers.engine import JOB_TIMEOUT, OUT, Container, aip_dirs, common, supply_chain, writable_dir

pytestmark = pytest.mark.containers
TRAIN = ["--module", "tests.pytorch.loader_workers", "--data-workers", "4", "--log-every", "10"]


def run_with_shm(container: Container, shm: str) -> subprocess.CompletedProcess[str]:
    """Run to completion with a /dev/shm of ``shm`` (removed afterwards), output captured."""
    try:
        return subprocess.run(container.command("--rm", "--shm-size", shm), capture_output=True, text=True,
                              timeout=JOB_TIMEOUT, check=False)
    finally:
        container.remove()


@pytest.mark.parametrize(("shm", "workers"), [("64m", ["0"]), ("1g", ["0", "1", "2", "3"])])
def test_data_workers_fit_dev_shm_instead_of_dying_with_bus_error(
        engine: Any, built: Any, tmp_path: Path, shm: str, workers: list[str]) -> None:
    volume = writable_dir(tmp_path / "volume")
    job = Container(engine, built("pytorch"), TRAIN, env=aip_dirs(),
                    volumes={volume: OUT, ROOT / "tests": "/app/tests:ro"})
    proc = run_with_shm(job, shm)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    warnings = [line for line in proc.stdout.splitlines() if "WARNING doctor: shm:" in line]
    if shm == "64m":
        (warning,) = warnings
        assert "64 MiB free of 64 MiB (Docker's default)" in warning
        assert "caps --data-workers at 1 (was 4)" in warning and "--shm-size" in warning
    else:
        assert warnings == []
    assert sorted(p.name for p in (volume / "loader-workers").iterdir()) == workers
    assert (volume / "model" / "training_summary.json").is_file()


def test_doctor_in_the_image_reports_the_small_dev_shm_without_a_framework(
        engine: Any, built: Any, tmp_path: Path) -> None:
    volume = writable_dir(tmp_path / "volume")
    code = ("import json, sys; from entrypoint.cli import main; rc = main(['doctor', '--json', *sys.argv[1:]]); "
            "print(json.dumps(sorted(m for m in ('torch', 'tensorflow', 'horovod') if m in sys.modules))); "
            "sys.exit(rc)")
    pinned = f"localhost/trainer-pytorch@{supply_chain.image_digest(engine, common.image_ref('pytorch'))}"
    probe = Container(engine, built("pytorch"), ["-c", code, *TRAIN], env={**aip_dirs(), "TRAINER_IMAGE": pinned},
                      entrypoint="python", volumes={volume: OUT, ROOT / "tests": "/app/tests:ro"})
    proc = run_with_shm(probe, "64m")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    *report, imported = proc.stdout.splitlines()
    assert json.loads(imported) == []
    checks = {c["check"]: c for c in json.loads("\n".join(report))["checks"]}
    assert checks["shm"]["status"] == "warning" and "caps --data-workers at 1" in checks["shm"]["message"]
    assert checks["driver"]["status"] == "skipped"  # the CPU image on a machine without GPUs
    assert checks["outputs"]["status"] == "ok"
    sbom = hashlib.sha256(supply_chain.keep_sbom(engine, "pytorch", "cpu").read_bytes()).hexdigest()
    assert checks["image"]["status"] == "ok" and pinned in checks["image"]["message"]  # the digest the job ran
    assert f"sha256:{sbom}" in checks["image"]["message"]  # its bill of materials, the one built into it
    assert not (volume / "model").exists()  # doctor created nothing
