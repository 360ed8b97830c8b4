"""JAX with Keras 3 across processes, for real: weights against one process, every cluster format, the stop protocol,
a corrupt checkpoint, and an unmodified Keras 3 example (docs/jax.md)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import signal
import subprocess
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from entrypoint.failures.records import read_records
from entrypoint.lifecycle.startup.ports import free_ports
from entrypoint.outputs.checkpoints import committed
from tests.metadata import FakeMetadata
from tests.references import reference as shared_reference
from tests.runs import Job, entrypoint, failure_text

h5py = pytest.importorskip("h5py")  # the JAX venv's (Keras 3's); the other tiers collect this module and skip it
pytestmark = [pytest.mark.jax, pytest.mark.slow]
HOOKS = ("--framework", "jax", "--module", "tests.jax.tiny_hooks", "--timeout", "120")
FAST = ("--epochs", "2", "--log-every", "4")
EXAMPLE = Path(__file__).with_name("mnist_convnet.py")
PINNED = "us-docker.pkg.dev/p/r/jax@sha256:" + "ab" * 32  # TRAINER_IMAGE of a pinned job
GRACE = 25.0  # the platform's grace (--grace-period's default): its SIGKILL follows when a process is still there


def weights(model_dir: Path) -> list[np.ndarray]:
    """Every array of the exported ``model.keras`` (its ``model.weights.h5``), in file order."""
    with zipfile.ZipFile(model_dir / "model.keras") as archive:
        data = archive.read("model.weights.h5")
    found: list[np.ndarray] = []
    with h5py.File(io.BytesIO(data), "r") as h5:
        h5.visititems(lambda name, item: found.append(np.asarray(item)) if isinstance(item, h5py.Dataset) else None)
    assert found
    return found


def assert_close(a: list[np.ndarray], b: list[np.ndarray], tol: float) -> None:
    assert len(a) == len(b)
    worst = max(float(np.max(np.abs(x - y))) if x.size else 0.0 for x, y in zip(a, b, strict=True))
    assert worst <= tol, f"largest difference {worst}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two processes under ``local --workers 2``, 8 samples a replica: the run the others are compared with, run once
    for every test and xdist worker that asks (tests/references.py)."""
    out = shared_reference(tmp_path_factory, "jax-local-workers-2", lambda out: [
        "local", "--workers", "2", "--restart-policy", "never", "--output-dir", str(out), "--",
        "run", *HOOKS, *FAST, "--batch-size", "8"]).out
    summary = json.loads((out / "model" / "training_summary.json").read_text())
    assert (summary["world_size"], summary["replicas_in_sync"], summary["global_batch_size"]) == (2, 2, 16)
    assert summary["strategy"] == "data_parallel" and summary["final_step"] == 32
    return out


@pytest.fixture(scope="module")
def sbom(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bill of materials as an image keeps it (TRAINER_SBOM names it here, as tests/unit/test_sbom.py does)."""
    doc = tmp_path_factory.mktemp("jax-image") / "sbom.cdx.json"
    doc.write_text(json.dumps({"bomFormat": "CycloneDX", "components": [
        {"name": "jax", "version": "0.0.0", "purl": "pkg:pypi/jax@0.0.0"}]}))
    return doc


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory, sbom: Path) -> Path:
    """One process at the reference's global batch, uninterrupted, in a pinned image (as job vertex writes it)."""
    out = tmp_path_factory.mktemp("jax-single")
    proc = entrypoint("run", *HOOKS, *FAST, "--batch-size", "16", "--job-dir", str(out),
                      env={"TRAINER_IMAGE": PINNED, "TRAINER_SBOM": str(sbom)})
    assert proc.returncode == 0, failure_text(proc)
    return out


def test_two_processes_train_as_one_at_twice_the_batch(reference: Path, single: Path) -> None:
    assert_close(weights(single / "model"), weights(reference / "model"), 1e-5)


def test_the_summary_names_the_image_it_ran_in(single: Path, sbom: Path) -> None:
    """The digest the job's spec pinned and the hash of the image's bill of materials, as doctor prints them."""
    image = json.loads((single / "model" / "training_summary.json").read_text())["image"]
    assert image == {"reference": PINNED, "digest": PINNED.rpartition("@")[2], "sbom": str(sbom), "packages": 1,
                     "sbom_sha256": hashlib.sha256(sbom.read_bytes()).hexdigest()}


def _format(kind: str, rank: int, ports: list[int]) -> dict[str, str]:
    chief, worker = f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"
    if kind == "kubeflow jax runtime":
        return {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(rank), "JAX_COORDINATOR_ADDRESS": chief,
                "JAX_COORDINATOR_PORT": str(ports[0])}
    task = {"type": "chief", "index": 0} if rank == 0 else {"type": "worker", "index": 0}
    return {"TF_CONFIG": json.dumps({"cluster": {"chief": [chief], "worker": [worker]}, "task": task})}


@pytest.mark.parametrize("kind", ["kubeflow jax runtime", "tf_config"])
def test_every_cluster_format_gives_the_same_training(kind: str, reference: Path, tmp_path: Path) -> None:
    """Two `run` processes started as the platform starts them (Kubeflow Trainer's JAX_*, a TFJob's TF_CONFIG)."""
    ports = free_ports(2)
    jobs = [Job("run", *HOOKS, *FAST, "--batch-size", "8", "--job-dir", str(tmp_path / f"node{rank}"),
                env=_format(kind, rank, ports)) for rank in (0, 1)]
    try:
        codes = [job.wait(timeout=400) for job in jobs]
        assert codes == [0, 0], "\n".join(job.output()[-3000:] for job in jobs)
    finally:
        for job in jobs:
            job.cleanup()
    assert_close(weights(tmp_path / "node0" / "model"), weights(reference / "model"), 1e-5)
    assert not (tmp_path / "node1" / "model").exists()  # the chief's outputs only


def stop(job: Job, pattern: str, delay: float = 0.0) -> tuple[int, float, str]:
    """SIGTERM ``job`` ``delay`` seconds after its first line matching ``pattern``; the platform's SIGKILL at
    ``GRACE`` seconds after it if anything is left: its exit code, the seconds it took, its output."""
    try:
        job.wait_for(pattern, timeout=300)
        time.sleep(delay)
        sent = job.send(signal.SIGTERM)
        try:
            code = job.wait(timeout=GRACE)
        except subprocess.TimeoutExpired:
            os.killpg(job.proc.pid, signal.SIGKILL)
            code = job.wait(timeout=30)
        return code, time.monotonic() - sent, job.output()
    finally:
        job.cleanup()


def last_record(job_dir: Path, replicas: int = 1) -> str:
    """The message of the newest failure record, the same class (``preempted``, 143) on every replica."""
    newest = [r for r in read_records(str(job_dir), 0) if r.replica != "local"][-replicas:]  # oldest first
    assert all(r.failure_class == "preempted" and r.exit_code == 143 for r in newest), newest
    return newest[-1].message


def test_one_process_stopped_in_each_phase_commits_what_it_trained_and_resumes_bit_exact(
        single: Path, tmp_path: Path) -> None:
    """SIGTERM while building the model, at a random moment of an evaluation, and in the export; then the rerun."""
    args = ("run", *HOOKS, *FAST, "--batch-size", "16", "--job-dir", str(tmp_path))
    code, took, out = stop(Job(*args, "--", "--build-sleep", "60"), "build_model: sleeping")
    assert code == 143, out[-3000:]
    assert "while building the model (build_model): nothing trained in this attempt" in last_record(tmp_path)
    assert committed(tmp_path / "checkpoints") == []
    print(f"figure: one JAX process stopped while building: exited {took:.1f} s after SIGTERM")
    code, took, out = stop(Job(*args, "--", "--eval-sleep", "0.3"), "evaluation batch", random.uniform(0.0, 0.8))
    assert code == 143, out[-3000:]
    assert [step for step, _ in committed(tmp_path / "checkpoints")] == [16]  # the epoch's trained step
    assert "evaluating epoch 1 (abandoned after" in last_record(tmp_path)
    print(f"figure: one JAX process stopped in an evaluation: exited {took:.1f} s after SIGTERM")
    code, took, out = stop(Job(*args, "--", "--export-sleep", "60"), "export: sleeping")
    assert code == 143, out[-3000:]
    assert "the checkpoint of the final step 32 is committed" in last_record(tmp_path)
    assert not (tmp_path / "model" / "model.keras").exists()
    print(f"figure: one JAX process stopped in the export: exited {took:.1f} s after SIGTERM")
    rerun = entrypoint(*args)
    assert rerun.returncode == 0, failure_text(rerun)
    assert "resumed at step 32 (epoch 2, batch 0)" in rerun.stdout + rerun.stderr
    for got, expected in zip(weights(tmp_path / "model"), weights(single / "model"), strict=True):
        assert np.array_equal(got, expected)


def test_a_step_longer_than_the_grace_period_ends_within_it_saying_what_is_not_committed(tmp_path: Path) -> None:
    """Steps of 5 s against --grace-period 3: the process ends itself at the grace less its record's margin, before
    the platform's kill, its class ``preempted_uncommitted`` (the steps it trained are not committed)."""
    job = Job("run", *HOOKS, *FAST, "--batch-size", "16", "--log-every", "1", "--grace-period", "3", "--job-dir",
              str(tmp_path), "--", "--sleep", "5")
    code, took, out = stop(job, r"step [1-9]/32")
    assert code == 143 and took < 3 + 3, (took, out[-3000:])
    (record,) = read_records(str(tmp_path), 0)
    assert record.failure_class == "preempted_uncommitted" and record.exit_code == 143, record
    assert "was not committed: the restart starts from the first step" in record.message, record.message
    assert committed(tmp_path / "checkpoints") == []
    print(f"figure: one JAX process, steps of 5 s, --grace-period 3: ended {took:.1f} s after SIGTERM")


def test_a_slow_read_is_live_not_hung_and_a_stop_in_it_commits_the_step_before(tmp_path: Path) -> None:
    """Each batch's read takes 4 s, in parts of 1 s, under --hang-timeout 3: live, not hung. A SIGTERM in the read of
    step 4 interrupts it (it would hold the stop 4 s): step 3, the newest trained, is committed."""
    job = Job("run", *HOOKS, "--epochs", "2", "--batch-size", "128", "--log-every", "1", "--hang-timeout", "3",
              "--job-dir", str(tmp_path), "--", "--rows", "512", "--read-sleep", "1")
    code, took, out = stop(job, r"step 3/8", 1.5)
    assert code == 143, out[-3000:]
    assert [step for step, _ in committed(tmp_path / "checkpoints")] == [3]
    assert "at step 3 while waiting for the next batch: checkpoint" in last_record(tmp_path)
    print(f"figure: one JAX process stopped in a read of 4 s: exited {took:.1f} s after SIGTERM")


def test_the_platforms_notice_in_an_evaluation_commits_the_trained_step_before_the_kill(tmp_path: Path) -> None:
    """GCE's reclaim notice at a random moment of epoch 1's evaluation: step 16 committed at once, before the
    evaluation ends; then the platform's SIGKILL (no signal to save on). The same checkpoint as a stop in the
    evaluation commits, whose resume the stop's test proves bit-exact."""
    args = ("run", *HOOKS, *FAST, "--batch-size", "16", "--job-dir", str(tmp_path))
    with FakeMetadata() as metadata:
        job = Job(*args, "--", "--eval-sleep", "0.5", env={"GCE_METADATA_HOST": metadata.host})
        try:
            job.wait_for("evaluation batch", timeout=300)
            time.sleep(random.uniform(0.0, 0.6))
            metadata.values["instance/preempted"] = "TRUE"
            job.wait_for(r"advance notice from the platform: .*: checkpoint of step 16 committed")
            os.killpg(job.proc.pid, signal.SIGKILL)
            job.wait(timeout=30)
        finally:
            job.cleanup()
    out = job.output()
    before = out.split("checkpoint of step 16 committed")[0]
    assert "evaluation batch" in before and "epoch 1: " not in before, out[-3000:]  # during the evaluation
    assert [step for step, _ in committed(tmp_path / "checkpoints")] == [16]  # a resume from it: the stop's test


def test_two_processes_stopped_mid_epoch_and_in_an_evaluation_agree_and_resume_bit_exact(reference: Path,
                                                                                         tmp_path: Path) -> None:
    args = ("local", "--workers", "2", "--restart-policy", "never", "--output-dir", str(tmp_path), "--",
            "run", *HOOKS, *FAST, "--batch-size", "8", "--log-every", "1")
    job = Job(*args, "--", "--sleep", "0.2")
    code, _, out = stop(job, r"step ([6-9]|1[0-5])/32")
    assert code == 143, out[-4000:]
    seen = job.last_step()
    step, _ = committed(tmp_path / "checkpoints")[-1]
    assert 6 <= seen <= step < 16, (seen, step)  # mid-epoch 1 of 2: the step every process agreed on
    records = read_records(str(tmp_path), 0)
    assert {r.replica for r in records} == {"workerpool0-0", "workerpool1-0"}
    assert all(r.failure_class == "preempted" and r.exit_code == 143 for r in records), records
    assert not (tmp_path / "model" / "training_summary.json").exists()
    code, took, out = stop(Job(*args, "--", "--eval-sleep", "0.3"), "evaluation batch", random.uniform(0.0, 0.8))
    assert code == 143, out[-4000:]
    assert committed(tmp_path / "checkpoints")[-1][0] == 16  # both processes trained epoch 1 to its end
    assert "evaluating epoch 1 (abandoned after" in last_record(tmp_path, 2)
    print(f"figure: two JAX processes stopped in an evaluation: exited {took:.1f} s after SIGTERM")
    # Live is not hung: epoch 2's evaluation (4 batches of 1.2 s or more) outlasts --hang-timeout, each batch does not.
    rerun = entrypoint(*args, "--hang-timeout", "4", "--", "--eval-sleep", "1.2")
    assert rerun.returncode == 0, failure_text(rerun)
    assert "resumed at step 16 (epoch 0, batch 16)" in rerun.stdout + rerun.stderr
    for got, expected in zip(weights(tmp_path / "model"), weights(reference / "model"), strict=True):
        assert np.array_equal(got, expected)  # bit-exact: the data position, the RNG state and the optimizer


def test_a_corrupt_newest_checkpoint_is_skipped(tmp_path: Path) -> None:
    args = ("run", *HOOKS, *FAST, "--job-dir", str(tmp_path), "--", "--rows", "128")
    proc = entrypoint(*args)
    assert proc.returncode == 0, failure_text(proc)
    trained = weights(tmp_path / "model")
    steps = [step for step, _ in committed(tmp_path / "checkpoints")]
    assert steps == [16, 32]
    newest = committed(tmp_path / "checkpoints")[-1][1]
    victim = max((p for p in Path(str(newest)).rglob("*") if p.is_file() and p.name != "COMMITTED"),
                 key=lambda p: p.stat().st_size)
    victim.write_bytes(b"\0" * victim.stat().st_size)
    rerun = entrypoint(*args)
    assert rerun.returncode == 0, failure_text(rerun)
    text = rerun.stdout + rerun.stderr
    assert "resumed at step 16 (epoch 1, batch 0)" in text, text[-3000:]
    for got, expected in zip(weights(tmp_path / "model"), trained, strict=True):
        assert np.array_equal(got, expected)


def test_an_unmodified_keras_3_example_trains_across_two_replicas(tmp_path: Path) -> None:
    """keras-io's MNIST convnet (only its data load differs): ``model.fit`` with NumPy arrays, across 2 replicas."""
    proc = entrypoint("local", "--workers", "2", "--restart-policy", "never", "--output-dir", str(tmp_path), "--",
                      "run", "--framework", "jax", "--script", str(EXAMPLE), "--timeout", "120", timeout=600)
    assert proc.returncode == 0, failure_text(proc)
    text = proc.stdout + proc.stderr
    accuracy = {line.split("]")[0] + "]": line.rsplit(":", 1)[1] for line in text.splitlines()
                if "Test accuracy:" in line}
    assert set(accuracy) == {"[workerpool0-0]", "[workerpool1-0]"}, text[-3000:]
    assert len(set(accuracy.values())) == 1  # one model: both replicas evaluate the same weights on the whole set
    assert "DataParallel over a 2x1 mesh" in text
