"""Real multi-process PyTorch jobs on 127.0.0.1 over gloo: files written and exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from entrypoint.lifecycle.startup.ports import free_ports
from entrypoint.outputs import checkpoints
from tests.conftest import PYTHON, ROOT, subprocess_env
from tests.runs import MARKER_VARIABLE, entrypoint, failure_text, hypertune_files, processes_with, summary, wait_gone

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
RUN = ["run", "--framework", "pytorch", "--timeout", "60"]


def test_two_replicas_train_in_sync_and_only_the_chief_writes(tmp_path: Path) -> None:
    proc = entrypoint("local", "--workers", "2", "--trial", "5", "--output-dir", str(tmp_path), "--",
                      *RUN, "--module", "trainers.digits_torch", "--epochs", "8", "--hypertune-metric", "accuracy")
    assert proc.returncode == 0, failure_text(proc)
    trial_dir = tmp_path / "5"
    result = summary(trial_dir / "model")
    assert result["world_size"] == 2 and result["ranks"] == [0, 1]
    assert result["param_digests"][0] == result["param_digests"][1]
    assert result["final_step"] == result["expected_steps"] > 0
    assert result["metrics"]["accuracy"] >= 0.90
    # One export, one checkpoint series, one hypertune file: the chief's.
    assert sorted(p.name for p in (trial_dir / "model").iterdir()) == ["model.pt", "model.safetensors",
                                                                       "state_dict.pt", "training_summary.json"]
    assert list(tmp_path.glob("**/model.pt")) == [trial_dir / "model" / "model.pt"]
    series = checkpoints.committed(trial_dir / "checkpoints")
    assert series and series[-1][0] == result["final_step"]
    assert {p.parent.parent for p in tmp_path.glob("**/ckpt-*/state.pt")} == {trial_dir / "checkpoints"}
    assert list((trial_dir / "logs").glob("events.out.tfevents.*"))
    files = hypertune_files(tmp_path)
    assert [f.parent.parent.name for f in files] == ["workerpool0-0"]
    lines = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert lines and all(line["trial"] == "5" for line in lines)
    assert float(lines[-1]["accuracy"]) >= 0.90 and int(lines[-1]["global_step"]) == result["final_step"]
    # The exported model loads back and predicts.
    import torch

    model = torch.load(trial_dir / "model" / "model.pt", weights_only=False)
    assert model(torch.zeros(3, 64)).shape == (3, 10)


def _newest_committed(ckpt_dir: Path, timeout: float = 180) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = checkpoints.committed(ckpt_dir, warn=False)
        if found:
            return found[-1][0]
        time.sleep(0.2)
    raise AssertionError("no committed checkpoint appeared")


def test_killed_job_resumes_from_newest_committed_checkpoint(tmp_path: Path) -> None:
    args = ["-m", "entrypoint", "local", "--workers", "2", "--output-dir", str(tmp_path), "--", *RUN,
            "--module", "tests.pytorch.slow_digits", "--epochs", "2", "--checkpoint-every", "5"]
    job = subprocess.Popen([PYTHON, *args], cwd=ROOT, env=subprocess_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _newest_committed(tmp_path / "checkpoints")
        job.send_signal(signal.SIGTERM)  # preemption: the emulator forwards it to every replica
        assert job.wait(timeout=60) == 143
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    ckpt_dir = tmp_path / "checkpoints"
    resume_step = checkpoints.committed(ckpt_dir, warn=False)[-1][0]
    assert not (tmp_path / "model" / "training_summary.json").exists()
    torn = checkpoints.checkpoint_path(ckpt_dir, resume_step + 1000)  # newer but never committed
    torn.mkdir()
    (torn / "state.pt").write_bytes(b"torn")
    proc = subprocess.run([PYTHON, *args], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, failure_text(proc)
    result = summary(tmp_path / "model")
    assert result["start_step"] == resume_step > 0
    assert result["final_step"] == result["expected_steps"]
    assert result["param_digests"][0] == result["param_digests"][1]
    assert "skipping torn checkpoint" in proc.stdout + proc.stderr


def test_one_node_with_two_processes(tmp_path: Path) -> None:
    proc = entrypoint(*RUN, "--module", "trainers.digits_torch", "--nproc-per-node", "2", "--epochs", "1",
                      "--job-dir", str(tmp_path))
    assert proc.returncode == 0, failure_text(proc)
    result = summary(tmp_path / "model")
    assert (result["world_size"], result["ranks"], result["backend"]) == (2, [0, 1], "gloo")


def test_plain_torchrun_script_trains_across_two_replicas(tmp_path: Path) -> None:
    out = tmp_path / "script-out"
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(tmp_path), "--", *RUN,
                      "--script", "tests/pytorch/ddp_script.py", "--", "--out", str(out))
    assert proc.returncode == 0, failure_text(proc)
    result = json.loads((out / "result.json").read_text())
    assert result["world_size"] == 2 and result["digests"][0] == result["digests"][1]
    assert result["loss"] < 0.05


def test_context_api_in_script_mode(tmp_path: Path) -> None:
    proc = entrypoint("local", "--workers", "2", "--trial", "9", "--output-dir", str(tmp_path), "--", *RUN,
                      "--script", "tests/pytorch/context_script.py")
    assert proc.returncode == 0, failure_text(proc)
    who = json.loads((tmp_path / "9" / "model" / "who.json").read_text())
    assert who["rank"] == 0 and who["world_size"] == 2
    assert who["checkpoint_dir"].rstrip("/").endswith("9/checkpoints")
    files = hypertune_files(tmp_path)
    assert [f.parent.parent.name for f in files] == ["workerpool0-0"]
    line = json.loads(files[0].read_text().splitlines()[-1])
    assert (line["trial"], line["accuracy"], line["global_step"]) == ("9", "0.5", "7")


def test_missing_peer_fails_within_timeout_naming_it(tmp_path: Path) -> None:
    chief, worker = free_ports(2)
    spec = {"cluster": {"workerpool0": [f"127.0.0.1:{chief}"], "workerpool1": [f"127.0.0.1:{worker}"]},
            "environment": "cloud", "task": {"type": "workerpool0", "index": 0}}
    started = time.monotonic()
    proc = entrypoint("run", "--framework", "pytorch", "--timeout", "5", "--module", "trainers.digits_torch",
                      "--job-dir", str(tmp_path), env={"CLUSTER_SPEC": json.dumps(spec)}, timeout=120)
    elapsed = time.monotonic() - started
    assert proc.returncode >= 128, failure_text(proc)
    assert f"workerpool1[0] (127.0.0.1:{worker})" in proc.stderr
    assert elapsed < 60
    assert not (tmp_path / "model").exists()


def test_resume_from_that_does_not_exist_is_a_config_error(tmp_path: Path) -> None:
    proc = entrypoint(*RUN, "--module", "trainers.digits_torch", "--job-dir", str(tmp_path),
                      "--resume-from", str(tmp_path / "nope"))
    assert proc.returncode == 2, failure_text(proc)
    assert "--resume-from" in proc.stderr and "does not exist" in proc.stderr


@pytest.mark.gpu
def test_example_trains_with_nccl_on_one_gpu(tmp_path: Path) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    proc = entrypoint(*RUN, "--module", "trainers.digits_torch", "--epochs", "8", "--job-dir", str(tmp_path),
                      env=env)
    assert proc.returncode == 0, failure_text(proc)
    result = summary(tmp_path / "model")
    assert result["backend"] == "nccl" and result["device"].startswith("cuda")
    assert result["metrics"]["accuracy"] >= 0.90


def test_first_failing_replica_stops_the_others_and_sets_the_exit_code(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(tmp_path), "--", *RUN,
                      "--script", "tests/pytorch/fail_script.py", timeout=200)
    assert proc.returncode == 3, failure_text(proc)
    assert time.monotonic() - started < 100  # the chief's 120 s sleep was cut short
    assert "[workerpool1-0]" in proc.stdout and "stopping the others" in proc.stdout


def test_ctrl_c_reaches_every_replica_and_their_workers(tmp_path: Path) -> None:
    marker = f"sleep-marker-{os.getpid()}"
    args = [PYTHON, "-m", "entrypoint", "local", "--workers", "2", "--output-dir", str(tmp_path), "--", *RUN,
            "--nproc-per-node", "2", "--script", "tests/pytorch/sleep_script.py", "--", "120"]
    job = subprocess.Popen(args, cwd=ROOT, env=subprocess_env({MARKER_VARIABLE: marker}), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)

    def workers() -> list[int]:
        """Processes the emulator started, and theirs (every one inherits the marker)."""
        return [pid for pid in processes_with(marker) if pid != job.pid]

    try:
        # 2 replicas x (elastic agent + its fork server + 2 workers, each a client and the rank the server forked);
        # a rank's client waits for its server's imports, which took more than 120 s in a fresh run's load of 15
        deadline = time.monotonic() + 300
        while len(workers()) < 12 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(workers()) == 12, [Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in workers()]
        job.send_signal(signal.SIGINT)
        assert job.wait(timeout=60) == 130
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert wait_gone(marker, timeout=10) == []
