"""Real Horovod processes on 127.0.0.1 over gloo, launched without ssh or horovodrun."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from entrypoint.lifecycle.startup.ports import free_ports
from tests.runs import entrypoint, failure_text, hypertune_files, summary

pytest.importorskip("horovod.torch")
pytestmark = [pytest.mark.horovod, pytest.mark.slow]
RUN = ["run", "--framework", "horovod", "--timeout", "60"]


def test_two_replicas_allreduce_in_step_and_only_rank0_writes(tmp_path: Path) -> None:
    proc = entrypoint("local", "--workers", "2", "--trial", "2", "--output-dir", str(tmp_path), "--", *RUN,
                      "--module", "tests.horovod.divergent_init", "--epochs", "3", "--hypertune-metric", "accuracy")
    assert proc.returncode == 0, failure_text(proc)
    result = summary(tmp_path / "2" / "model")
    assert result["backend"] == "horovod" and result["world_size"] == 2
    init, start, final = (result["details"]["init_param_digests"], result["details"]["start_param_digests"],
                          result["param_digests"])
    assert init[0] != init[1]  # the ranks built different models...
    assert start == [init[0], init[0]]  # ...and rank 0's parameters reached rank 1 before training
    assert final[0] == final[1]
    assert result["metrics"]["accuracy"] >= 0.85
    assert list(tmp_path.glob("**/model.pt")) == [tmp_path / "2" / "model" / "model.pt"]
    assert [f.parent.parent.name for f in hypertune_files(tmp_path)] == ["workerpool0-0"]
    goodput = result["goodput"]  # the job ledger: Horovod's hooks loop is PyTorch's, its steps counted as theirs
    assert goodput["buckets"]["productive"] > 0 and goodput["attempts"] == 1, goodput


def _seen(out: Path) -> list[dict[str, str]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_unmodified_horovod_script_and_fusion_settings(tmp_path: Path) -> None:
    out = tmp_path / "defaults"
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(tmp_path / "a"), "--", *RUN,
                      "--script", "tests/horovod/hvd_script.py", "--", "--out", str(out))
    assert proc.returncode == 0, failure_text(proc)
    seen = _seen(out)
    assert all(s["size"] == 2 and s["digests"][0] == s["digests"][1] for s in seen)
    assert seen[0]["loss"] < 0.05
    assert {(s["fusion_threshold"], s["cycle_time"]) for s in seen} == {("134217728", "5")}
    # A user-set variable wins over our default; the flag sets what the user left alone.
    out = tmp_path / "override"
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(tmp_path / "b"), "--", *RUN,
                      "--cycle-time-ms", "2.5", "--fusion-threshold", "999", "--script", "tests/horovod/hvd_script.py",
                      "--", "--out", str(out), env={"HOROVOD_FUSION_THRESHOLD": "1048576"})
    assert proc.returncode == 0, failure_text(proc)
    assert {(s["fusion_threshold"], s["cycle_time"]) for s in _seen(out)} == {("1048576", "2.5")}


@pytest.mark.parametrize("started_pool", ["workerpool0", "workerpool1"])
def test_missing_peer_fails_within_timeout_naming_it(tmp_path: Path, started_pool: str) -> None:
    chief, worker = free_ports(2)
    spec = {"cluster": {"workerpool0": [f"127.0.0.1:{chief}"], "workerpool1": [f"127.0.0.1:{worker}"]},
            "environment": "cloud", "task": {"type": started_pool, "index": 0}}
    started = time.monotonic()
    proc = entrypoint("run", "--framework", "horovod", "--timeout", "5", "--module", "trainers.digits_torch",
                      "--job-dir", str(tmp_path), env={"CLUSTER_SPEC": json.dumps(spec)}, timeout=120)
    assert proc.returncode >= 128, failure_text(proc)
    missing = f"workerpool1[0] (127.0.0.1:{worker})" if started_pool == "workerpool0" else f"127.0.0.1:{chief}"
    assert missing in proc.stderr.splitlines()[-1] and "gave up after 5 s (--timeout) waiting for" in proc.stderr
    assert time.monotonic() - started < 60


def test_horovod_example_script_learns_digits(tmp_path: Path) -> None:
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(tmp_path), "--", *RUN,
                      "--module", "trainers.digits_horovod", "--", "--epochs", "8")
    assert proc.returncode == 0, failure_text(proc)
    metrics = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["accuracy"] >= 0.90
    assert [f.parent.parent.name for f in hypertune_files(tmp_path)] == ["workerpool0-0"]


def test_unmodified_horovod_keras_script_trains_across_two_replicas(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")  # the Horovod CPU lock ships TF: there its ops must be built too
    out = tmp_path / "keras"
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(tmp_path), "--", *RUN,
                      "--script", "tests/horovod/hvd_keras_script.py", "--", "--out", str(out))
    assert proc.returncode == 0, failure_text(proc)
    result = json.loads((out / "keras.json").read_text())
    assert result["size"] == 2 and result["digests"][0] == result["digests"][1]
    assert result["losses"][-1] < result["losses"][0]
    assert result["legacy_keras"] == "1" and result["keras"].startswith("tf_keras")


def test_user_failure_after_rendezvous_is_not_reported_as_a_missing_peer(tmp_path: Path) -> None:
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(tmp_path), "--", *RUN,
                      "--script", "tests/horovod/fail_after_init.py", timeout=200)
    assert proc.returncode == 1, failure_text(proc)
    assert "gave up after" not in proc.stdout + proc.stderr
