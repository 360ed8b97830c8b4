"""JAX with Keras 3 across processes, for real: weights against one process, every cluster format, the stop protocol,
a corrupt checkpoint, and an unmodified Keras 3 example (docs/jax.md)."""

from __future__ import annotations

import io
import json
import signal
import zipfile
from pathlib import Path

import numpy as np
import pytest

from entrypoint.failures.records import read_records
from entrypoint.lifecycle.ports import free_ports
from entrypoint.outputs.checkpoints import committed
from tests.runs import Job, entrypoint, failure_text

h5py = pytest.importorskip("h5py")  # the JAX venv's (Keras 3's); the other tiers collect this module and skip it
pytestmark = [pytest.mark.jax, pytest.mark.slow]
HOOKS = ("--framework", "jax", "--module", "tests.jax.tiny_hooks", "--timeout", "120")
FAST = ("--epochs", "2", "--log-every", "4")
EXAMPLE = Path(__file__).with_name("mnist_convnet.py")


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
    """Two processes under ``local --workers 2``, 8 samples a replica: the run the others are compared with."""
    out = tmp_path_factory.mktemp("jax-reference")
    proc = entrypoint("local", "--workers", "2", "--restart-policy", "never", "--output-dir", str(out), "--",
                      "run", *HOOKS, *FAST, "--batch-size", "8")
    assert proc.returncode == 0, failure_text(proc)
    summary = json.loads((out / "model" / "training_summary.json").read_text())
    assert (summary["world_size"], summary["replicas_in_sync"], summary["global_batch_size"]) == (2, 2, 16)
    assert summary["strategy"] == "data_parallel" and summary["final_step"] == 32
    return out


def test_two_processes_train_as_one_at_twice_the_batch(reference: Path, tmp_path: Path) -> None:
    proc = entrypoint("run", *HOOKS, *FAST, "--batch-size", "16", "--job-dir", str(tmp_path))
    assert proc.returncode == 0, failure_text(proc)
    assert_close(weights(tmp_path / "model"), weights(reference / "model"), 1e-5)


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


def test_sigterm_mid_epoch_commits_the_agreed_step_and_the_rerun_resumes_bit_exact(reference: Path,
                                                                                    tmp_path: Path) -> None:
    args = ("local", "--workers", "2", "--restart-policy", "never", "--output-dir", str(tmp_path), "--",
            "run", *HOOKS, *FAST, "--batch-size", "8", "--log-every", "1")
    job = Job(*args, "--", "--sleep", "0.2")
    try:
        seen = job.wait_for_step(6, timeout=300)
        job.send(signal.SIGTERM)
        assert job.wait(timeout=200) == 143, job.output()[-4000:]
    finally:
        job.cleanup()
    step, _ = committed(tmp_path / "checkpoints")[-1]
    assert 6 <= seen <= step < 16, (seen, step)  # mid-epoch 1 of 2: the step every process agreed on
    records = read_records(str(tmp_path), 0)
    assert {r.replica for r in records} == {"workerpool0-0", "workerpool1-0"}
    assert all(r.failure_class == "preempted" and r.exit_code == 143 for r in records), records
    assert not (tmp_path / "model" / "training_summary.json").exists()
    rerun = entrypoint(*args)
    assert rerun.returncode == 0, failure_text(rerun)
    assert f"resumed at step {step} (epoch 0, batch {step})" in rerun.stdout + rerun.stderr
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
