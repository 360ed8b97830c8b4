"""Nothing a job wrote is lost or leaked, with real PyTorch processes: retention that keeps what loads,
non-finite losses, plan files, named peers, misclassified permissions.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
from pathlib import Path

import pytest

from entrypoint.outputs import checkpoints
from tests.runs import Job, entrypoint, failure_records, failure_text, last_line, replica_group, summary, wait_gone

torch = pytest.importorskip("torch")  # collected in every venv; these run where torch is
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
FAULTS = ["--module", "tests.pytorch.faults", "--log-every", "2", "--timeout", "60"]


def local_args(output: Path, *extra: str, policy: str = "never") -> list[str]:
    return ["local", "--workers", "2", "--output-dir", str(output), "--restart-policy", policy, "--", "run",
            "--framework", "pytorch", *FAULTS, *extra]


def run_args(job_dir: Path, *extra: str) -> list[str]:
    return ["run", "--framework", "pytorch", "--job-dir", str(job_dir), *FAULTS, *extra]


def strict_json(path: Path) -> object:
    """Parse ``path`` refusing NaN and infinities (what a strict JSON reader does)."""
    def refuse(token: str) -> object:
        raise AssertionError(f"{path} is not strict JSON: {token}")
    return json.loads(path.read_text(), parse_constant=refuse)


def all_finite(path: Path) -> bool:
    state = torch.load(path / "state.pt", weights_only=False)
    return all(bool(torch.isfinite(t).all()) for t in state["model"].values())


# ---- non-finite losses ------------------------------------------------------------------------------
def test_a_nan_loss_fails_permanently_keeps_finite_checkpoints_and_exports_nothing(tmp_path: Path) -> None:
    """NaN on one rank from step 5: every rank stops, exit 65, nothing exported, every checkpoint finite."""
    proc = entrypoint(*local_args(tmp_path, "--checkpoint-every", "2", "--hypertune-metric", "accuracy", "--",
                                  "--fault", "nan", "--at-step", "5", "--fault-rank", "1"))
    assert proc.returncode == 65, failure_text(proc)
    line = last_line(proc)
    assert line.startswith("entrypoint: error: nonfinite_loss on ") and line.endswith("(exit 65, permanent)"), line
    assert "at step 5" in line
    assert not (tmp_path / "model" / "model.pt").exists()
    assert not (tmp_path / "model" / "training_summary.json").exists()
    found = checkpoints.committed(tmp_path / "checkpoints", warn=False)
    assert found and max(step for step, _ in found) < 5
    assert all(all_finite(path) for _, path in found)
    assert not list(tmp_path.glob(".replicas/*/hypertune/output.metrics"))  # no metric after (or before) it
    assert {r["class"] for r in failure_records(tmp_path)} == {"nonfinite_loss"}


def test_on_nonfinite_skip_drops_that_steps_update_and_trains_on(tmp_path: Path) -> None:
    proc = entrypoint(*local_args(tmp_path, "--epochs", "1", "--on-nonfinite", "skip", "--", "--fault", "nan-once",
                                  "--at-step", "3", "--fault-rank", "0"))
    assert proc.returncode == 0, failure_text(proc)
    assert "step 3: the loss is NaN or infinite on 1 of 2 ranks: update skipped" in proc.stdout
    result = strict_json(tmp_path / "model" / "training_summary.json")
    assert isinstance(result, dict) and result["details"]["skipped_nonfinite_steps"] == [3]
    assert len(set(result["param_digests"])) == 1  # the replicas stayed in sync
    weights = torch.load(tmp_path / "model" / "state_dict.pt")
    assert all(bool(torch.isfinite(t).all()) for t in weights.values())
    assert all(v is None or math.isfinite(v) for v in result["metrics"].values())


# ---- retention --------------------------------------------------------------------------------------
def test_retention_never_leaves_only_checkpoints_that_do_not_load(tmp_path: Path) -> None:
    """Four checkpoints, the two newest corrupt; a resumed run saves and is SIGKILLed at once; the next resumes."""
    ckpt = tmp_path / "checkpoints"
    first = Job(*run_args(tmp_path, "--epochs", "2", "--checkpoint-every", "5", "--keep-checkpoints", "4", "--",
                          "--step-sleep", "0.02"))
    try:
        first.wait_for("checkpoint ckpt-00000020 committed")
        os.killpg(first.proc.pid, signal.SIGKILL)
        first.wait()
    finally:
        first.cleanup()
    assert [s for s, _ in checkpoints.committed(ckpt, warn=False)] == [5, 10, 15, 20]
    for step in (15, 20):
        state = checkpoints.checkpoint_path(ckpt, step) / "state.pt"
        state.write_bytes(state.read_bytes()[:1000])  # truncated
    resumed_args = run_args(tmp_path, "--epochs", "2", "--checkpoint-every", "7", "--keep-checkpoints", "2", "--",
                            "--step-sleep", "0.02")
    second = Job(*resumed_args)
    try:
        second.wait_for("checkpoint ckpt-00000014 committed")
        os.killpg(second.proc.pid, signal.SIGKILL)  # right after the first save of the resumed run
        second.wait()
    finally:
        second.cleanup()
    output = second.output()
    assert "resumed from" in output and "ckpt-00000010 at step 10" in output
    assert "deleting checkpoint" in output and "ckpt-00000020" in output  # the bad ones went first, named
    assert [s for s, _ in checkpoints.committed(ckpt, warn=False)] == [10, 14]
    third = entrypoint(*resumed_args)
    assert third.returncode == 0, failure_text(third)
    assert f"resumed from {checkpoints.checkpoint_path(ckpt, 14)} at step 14" in third.stdout
    assert summary(tmp_path / "model")["start_step"] == 14


# ---- secrets ------------------------------------------------------------------------------------------
def files_containing(root: Path, needle: bytes) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if needle in path.read_bytes():
                    found.append(path)
            except OSError:
                continue
    return found


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_a_sigkilled_job_leaves_no_plan_and_no_secret_on_disk(tmp_path: Path, nproc: str) -> None:
    """The plan (the user's arguments, a token among them) lives in memory: SIGKILL leaves nothing behind."""
    token = "canary-token-5e4d3c"
    system_tmp, output = tmp_path / "tmp", tmp_path / "out"
    system_tmp.mkdir()
    job = Job(*local_args(output, "--nproc-per-node", nproc, "--", "--api-token", token, "--step-sleep", "0.05"),
              env={"TMPDIR": str(system_tmp)})
    try:
        job.wait_for_step(4)
        if nproc == "2":  # the agent's workers were handed the plan in memory (environ shows a start's variables)
            plans = [Path(f"/proc/{pid}/environ").read_bytes() for pid in job.left()]
            assert any(b"TRAINER_PLAN_FILE=/proc/" in environ for environ in plans)
        os.killpg(job.proc.pid, signal.SIGKILL)  # local and its whole process tree's leader
        job.wait()
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    assert files_containing(output, token.encode()) == []
    assert files_containing(system_tmp, token.encode()) == []
    assert not list(output.rglob("plan.json")) and not list(system_tmp.rglob("plan.json"))
    assert not (output / ".replicas").exists() or all(p.name == "hypertune" for p in output.glob(".replicas/*/*"))


# ---- outputs that cannot be written -------------------------------------------------------------------
def test_gcs_without_its_mount_or_credentials_is_one_line_naming_the_bucket_and_says_where_the_record_went(
        tmp_path: Path) -> None:
    if os.path.ismount("/gcs"):
        pytest.skip("this machine has a /gcs mount")
    pytest.importorskip("gcsfs")
    no_adc = {"TMPDIR": str(tmp_path), "GOOGLE_APPLICATION_CREDENTIALS": "", "STORAGE_EMULATOR_HOST": "",
              "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "NO_GCE_CHECK": "true"}
    proc = entrypoint("run", "--framework", "pytorch", "--module", "tests.pytorch.faults",
                      "--model-dir", "gs://bucket-canary-3b2a/model", env=no_adc)
    assert proc.returncode == 73, failure_text(proc)
    line = last_line(proc)
    assert line.startswith("entrypoint: error: output_not_writable") and "gs://bucket-canary-3b2a: no Application " \
        "Default Credentials" in line and "GOOGLE_APPLICATION_CREDENTIALS" in line, line
    assert "Traceback" not in proc.stderr
    assert not Path("/gcs/bucket-canary-3b2a").exists()  # nothing created on the container's own disk
    fallback = tmp_path / "trainer-failures"
    (record,) = list(fallback.glob("*.json"))
    assert f"it went to {record} instead" in proc.stderr


# ---- named peers --------------------------------------------------------------------------------------


def test_a_frozen_worker_under_local_is_named_by_the_hang_watchdog_as_the_root_cause(tmp_path: Path) -> None:
    # The first step is part of the start-up (--startup-timeout): on a loaded machine it took longer than 8 s (the
    # optimizer's first use imports torch._dynamo) and the watchdog fired before any worker froze. It is made slower
    # than --hang-timeout here on purpose; the step clock starts once it is over.
    job = Job(*local_args(tmp_path, "--hang-timeout", "8", "--grace-period", "2", "--", "--step-sleep", "0.05",
                          "--first-step-sleep", "10"))
    group = 0
    try:
        job.wait_for_step(6)
        group = replica_group(job, "workerpool1-0")
        os.killpg(group, signal.SIGSTOP)
        assert job.wait(120) == 129, job.output()[-3000:]
    finally:
        if group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGCONT)
        job.cleanup()
    line = last_line(job)
    assert line.startswith("entrypoint: error: hang on workerpool1-0, rank 1"), line
    assert "stopped responding" in line and "--hang-timeout" in line
