"""Sharded training end to end on CPU with gloo: FSDP2 and HSDP train what DDP trains, sharded checkpoints commit
every rank's files, resume at another world size without skipping or repeating a sample, load across formats,
survive SIGTERM and a rank killed mid-save, and export one model.safetensors.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from entrypoint.outputs import checkpoints
from tests.references import Reference, reference
from tests.runs import Job, entrypoint, failure_records, failure_text, last_line, summary, vanish, wait_gone

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
HOOKS = ["--framework", "pytorch", "--module", "tests.pytorch.sharded_hooks", "--timeout", "120",
         "--grace-period", "30", "--log-every", "1"]


def run_args(job_dir: Path, *extra: str, user: tuple[str, ...] = ()) -> list[str]:
    return ["run", *HOOKS, "--job-dir", str(job_dir), *extra, "--", *user]


def weights(job_dir: Path) -> dict[str, Any]:
    return dict(safetensors_torch.load_file(str(job_dir / "model" / "model.safetensors")))


def assert_close(a: dict[str, Any], b: dict[str, Any], atol: float) -> None:
    assert sorted(a) == sorted(b)
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= atol, f"the weights differ by up to {worst}"


def world_2(factory: pytest.TempPathFactory, strategy: str) -> Reference:
    """One job at world 2 with ``strategy`` (two epochs, a checkpoint every 8 steps), run once for the tests that
    read it: the DDP one is what an interrupted job of either strategy must end with."""
    return reference(factory, f"{strategy}-world-2", lambda out: run_args(
        out, "--nproc-per-node", "2", "--strategy", strategy, "--epochs", "2", "--checkpoint-every", "8"))


def test_fsdp_at_world_2_trains_the_weights_ddp_trains_and_commits_every_ranks_shards(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    ddp, fsdp = world_2(tmp_path_factory, "ddp"), world_2(tmp_path_factory, "fsdp")
    for strategy, stdout in (("ddp", ddp.stdout), ("fsdp", fsdp.stdout)):
        assert f"strategy {strategy}: --strategy {strategy}" in stdout
        said = stdout.count("sharded on CPU: allocations from 128 KiB up are given back")
        assert said == (1 if strategy == "fsdp" else 0)  # both ranks set it, rank 0 says so
    assert_close(weights(ddp.out), weights(fsdp.out), atol=1e-6)  # same seed, same batches
    sharded = fsdp.out
    result = summary(sharded / "model")
    assert result["strategy"] == "fsdp" and result["final_step"] == result["expected_steps"]
    assert sorted(p.name for p in (sharded / "model").iterdir()) == ["model.safetensors", "training_summary.json"]
    for step, path in checkpoints.committed(sharded / "checkpoints"):
        files = checkpoints.read_marker(path)["files"]
        assert sorted(files) == [".metadata", "__0_0.distcp", "__1_0.distcp", "extra.pt"], step
        assert all(set(entry) == {"size", "sha256"} for entry in files.values())
        checkpoints.verify(path)


def test_hsdp_across_two_nodes_of_two_processes_trains_what_ddp_trains(tmp_path: Path) -> None:
    """HSDP by node (survivors keep training: FSDP within the node, the loop's own average across the replicas) and
    FSDP2's own 2-D mesh (``--recovery restart``) both train what data parallelism over the 4 ranks trains: what one
    process trains at their global batch (4 x 8; each step's 32 samples are the 4 ranks' 8 of that step, and DDP over
    2 nodes of 2 processes ends within 1e-6 of it, measured). The reference is that one process, not a 7-process DDP
    job (16 s of CPU against 4, for the same weights)."""
    runs = {}
    reference = tmp_path / "one-process"
    proc = entrypoint("run", *HOOKS, "--job-dir", str(reference), "--batch-size", "32", "--epochs", "1", "--",
                      "--sgd", timeout=600)
    assert proc.returncode == 0, failure_text(proc)
    assert summary(reference / "model")["world_size"] == 1
    for name, recovery in (("hsdp", "in-place"), ("hsdp-2d", "restart")):
        out = tmp_path / name
        proc = entrypoint("local", "--workers", "2", "--output-dir", str(out), "--", "run", *HOOKS,
                          "--nproc-per-node", "2", "--strategy", "hsdp", "--recovery", recovery, "--epochs", "1",
                          "--", "--sgd", timeout=900)
        assert proc.returncode == 0, failure_text(proc)
        runs[name] = out
    for name in ("hsdp", "hsdp-2d"):
        assert summary(runs[name] / "model")["world_size"] == 4
        assert summary(runs[name] / "model")["strategy"] == "hsdp"
        assert_close(weights(reference), weights(runs[name]), atol=1e-5)  # 4 ranks reduce in another order


def consumed(record: Path, steps: int | None = None) -> list[list[int]]:
    """Each step's indices, of every rank (its first ``steps`` steps, or all of them)."""
    return [[int(i) for i in line.split()] for f in sorted(record.glob("*.txt"))
            for line in f.read_text().splitlines()[:steps]]


def test_sigterm_commits_every_shard_and_a_world_4_checkpoint_resumes_at_world_3(tmp_path: Path) -> None:
    windows, batch = 256, 8  # world 4: 8 steps per epoch
    first = tmp_path / "job"

    def args(job_dir: Path, world: int, record: Path) -> list[str]:
        record.mkdir()
        return run_args(job_dir, "--nproc-per-node", str(world), "--strategy", "fsdp", "--epochs", "2",
                        "--checkpoint-every", "2", user=("--windows", str(windows), "--record", str(record),
                                                          "--step-sleep", "0.2"))

    job = Job(*args(first, 4, tmp_path / "record"))
    try:
        job.wait_for("checkpoint ckpt-00000002 committed")
        job.send(signal.SIGTERM)
        assert job.wait(240) == 143, job.output()[-4000:]
    finally:
        job.cleanup()
    stopped = checkpoints.committed(first / "checkpoints")[-1]
    assert f"stopped by SIGTERM at step {stopped[0]}" in last_line(job)
    assert sorted(checkpoints.read_marker(stopped[1])["files"]) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp", "extra.pt"]
    before = consumed(tmp_path / "record")
    assert len(before) == 4 * stopped[0]  # every rank recorded exactly the committed steps
    world = 3  # a world 4 checkpoint regrouped over 3 ranks: no shard maps whole onto a new rank
    job_dir, record = tmp_path / f"world-{world}", tmp_path / f"record-{world}"
    shutil.copytree(first, job_dir)  # a copy of the stopped job
    proc = entrypoint(*args(job_dir, world, record), timeout=900)
    assert proc.returncode == 0, failure_text(proc)
    assert f"resharded from world 4 to {world}" in proc.stdout
    result = summary(job_dir / "model")
    assert result["final_step"] == result["expected_steps"] and result["world_size"] == world
    # The rest of epoch 1 over the new world: no sample seen twice, none skipped but the ragged end.
    done = stopped[0] * 4 * batch
    left = (windows - done) // world // batch
    after = consumed(record, left)
    seen = [i for step in before + after for i in step]
    assert len(seen) == len(set(seen)) == done + left * world * batch, world
    assert windows - len(seen) < world * batch, world  # only the ragged end, as drop_last leaves it


def test_sigterm_to_the_whole_group_with_loader_workers_commits_every_shard_and_a_corrupt_one_is_skipped(
        tmp_path: Path) -> None:
    """A preemption as tini -g delivers it: SIGTERM reaches every process of a sharded job, its DataLoader workers
    included; the step every rank agreed on is committed with every rank's shard and the job exits 143. A shard of
    that newest checkpoint corrupted afterwards (same size, other bytes: only the checksum tells), the restart names
    it, resumes from the one before and trains to the end, its loader workers evaluating each epoch."""
    job_dir = tmp_path / "job"
    args = run_args(job_dir, "--nproc-per-node", "2", "--strategy", "fsdp", "--epochs", "2", "--checkpoint-every",
                    "2", "--keep-checkpoints", "5", "--data-workers", "2",
                    user=("--windows", "256", "--step-sleep", "0.2"))
    job = Job(*args)
    try:
        job.wait_for("checkpoint ckpt-00000002 committed")
        os.killpg(job.proc.pid, signal.SIGTERM)
        assert job.wait(240) == 143, job.output()[-4000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    assert "killed by signal" not in job.output()  # no loader worker died under a rank
    (before, previous), (step, newest) = checkpoints.committed(job_dir / "checkpoints")[-2:]
    assert f"stopped by SIGTERM at step {step}" in last_line(job)
    assert sorted(checkpoints.read_marker(newest)["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp",
                                                                  "extra.pt"]
    assert {r["class"] for r in failure_records(job_dir)} == {"preempted"}
    shard = newest / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    proc = entrypoint(*args, timeout=600)
    assert proc.returncode == 0, failure_text(proc)
    assert f"checkpoint {newest} does not load (CheckpointError: __1_0.distcp does not match its checksum)" in \
        proc.stdout + proc.stderr
    assert f"resumed from {previous} at step {before}" in proc.stdout
    assert summary(job_dir / "model")["final_step"] == summary(job_dir / "model")["expected_steps"]
    assert "a rank left behind" not in proc.stdout + proc.stderr  # the loaders' fork servers end with their ranks


def test_a_ddp_checkpoint_resumes_sharded_and_a_sharded_one_replicated_as_if_uninterrupted(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    common = ("--nproc-per-node", "2", "--epochs", "2", "--checkpoint-every", "4")
    user = ("--step-sleep", "0.2")  # the weights do not depend on it (nor on the checkpoint cadence)
    job_dir = tmp_path / "job"
    for strategy, stop_at in (("ddp", "ckpt-00000004"), ("fsdp", "ckpt-00000016")):
        job = Job(*run_args(job_dir, "--strategy", strategy, *common, user=user))
        try:
            job.wait_for(f"checkpoint {stop_at} committed")
            job.send(signal.SIGTERM)
            assert job.wait(240) == 143, job.output()[-4000:]
        finally:
            job.cleanup()
    proc = entrypoint(*run_args(job_dir, "--strategy", "ddp", *common, user=user), timeout=600)
    assert proc.returncode == 0, failure_text(proc)
    assert_close(weights(world_2(tmp_path_factory, "ddp").out), weights(job_dir), atol=1e-6)


def test_a_rank_killed_mid_save_leaves_a_torn_checkpoint_that_the_restart_skips(tmp_path: Path) -> None:
    out = tmp_path / "job"  # the restart from storage (without peer snapshots, a lost FSDP rank restarts the job)
    job = Job("local", "--workers", "2", "--output-dir", str(out), "--", "run", *HOOKS, "--strategy", "fsdp",
              "--peer-snapshots", "off", "--epochs", "1", "--checkpoint-every", "2", "--checkpoint-mode", "sync", "--",
              "--width", "512", "--layers", "4", "--windows", "128")
    try:
        job.wait_for("checkpoint ckpt-00000002 committed", timeout=300)
        torn = checkpoints.partial_of(out / "checkpoints" / "ckpt-00000004")  # written beside its place
        deadline = time.monotonic() + 300
        while not (torn.is_dir() and any(torn.glob("__1_*")) and not checkpoints.is_committed(torn)):
            assert job.proc.poll() is None and time.monotonic() < deadline, job.output()[-3000:]
            time.sleep(0.005)
        vanish(job, "workerpool1-0")
        assert job.wait(600) == 0, job.output()[-4000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    output = job.output()
    assert "workerpool1-0 exited 137 (retryable): restart 1 of 5" in output
    # Every rank restarted resumes from the step committed before the torn one (a partial directory, never listed as
    # a checkpoint), never from the torn one ("resumed from" alone is what every resume logs)
    ckpt2 = out / "checkpoints" / "ckpt-00000002"
    assert f"resumed from {ckpt2} at step 2 (epoch 0, batch 2)" in output
    assert f"resumed from {torn} " not in output and f"resumed from {torn.with_name('ckpt-00000004')} " not in output
    assert (out / "model" / "model.safetensors").is_file()
    for _step, path in checkpoints.committed(out / "checkpoints"):
        checkpoints.verify(path)


def test_compile_with_fsdp_reports_the_compile_time(tmp_path: Path) -> None:
    # make test keeps Inductor's cache beside the venv (TEST_INDUCTOR_CACHE_DIR): the compiled kernels of the last run
    # are reused, as a warm user job's are, and the C++ compiles (most of this test's CPU) are not paid twice. DDP's
    # compile time: tests/pytorch/test_compile_cache.py's restarted job (DDP over two replicas, compiled).
    cache = os.environ.get("TEST_INDUCTOR_CACHE_DIR") or str(tmp_path / "inductor")
    job_dir = tmp_path / "fsdp"
    proc = entrypoint(*run_args(job_dir, "--nproc-per-node", "2", "--strategy", "fsdp", "--compile", "--epochs", "1",
                                user=("--layers", "1", "--windows", "64")),
                      env={"TORCHINDUCTOR_CACHE_DIR": cache}, timeout=900)
    assert proc.returncode == 0, failure_text(proc)
    assert summary(job_dir / "model")["details"]["compile_seconds"] > 0


def test_shard_units_naming_modules_not_in_the_model_is_one_line(tmp_path: Path) -> None:
    proc = entrypoint(*run_args(tmp_path / "job", "--nproc-per-node", "2", "--strategy", "fsdp",
                                user=("--units", "blocks.0", "nope")), timeout=300)
    assert proc.returncode == 2, failure_text(proc)
    assert "shard_units: names modules that are not in the model: 'nope'" in last_line(proc)


def test_a_checkpoint_of_another_model_is_refused_naming_the_tensor_and_nothing_is_overwritten(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    job_dir = tmp_path / "job"
    shutil.copytree(world_2(tmp_path_factory, "fsdp").out, job_dir)  # a finished FSDP job's dir, run on for longer
    before = {p: p.stat().st_mtime_ns for p in (job_dir / "checkpoints").rglob("*")}
    proc = entrypoint(*run_args(job_dir, "--nproc-per-node", "2", "--strategy", "fsdp", "--epochs", "3",
                                "--checkpoint-every", "8", user=("--width", "32")), timeout=600)
    assert proc.returncode == 2, failure_text(proc)
    assert "tok.weight is (64, 64) in the checkpoint but (64, 32) in the model" in last_line(proc)
    assert {p: p.stat().st_mtime_ns for p in (job_dir / "checkpoints").rglob("*")} == before


def test_an_fsdp2_script_in_torchtitans_style_runs_unchanged(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for args in (["run", "--framework", "pytorch", "--nproc-per-node", "2", "--job-dir", str(out / "node")],
                 ["local", "--workers", "2", "--output-dir", str(out / "local"), "--", "run", "--framework",
                  "pytorch"]):
        proc = entrypoint(*args, "--script", "tests/pytorch/fsdp_script.py", "--", str(tmp_path / args[0]),
                          timeout=600)
        assert proc.returncode == 0, failure_text(proc)
        report = json.loads((tmp_path / args[0] / "report.json").read_text())
        assert report["world_size"] == 2 and report["sharded"] and report["loss_fell"]


def test_sharded_checkpoints_and_the_export_go_to_gcs_and_a_restart_resumes_from_there(
        emulator: Any, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    from entrypoint.outputs.storage import RemotePath
    from tests.gcs import gs_dir

    out = gs_dir(request)
    env = {**emulator.env, "TMPDIR": str(tmp_path)}
    args = ["local", "--workers", "2", "--output-dir", out, "--", "run", *HOOKS, "--strategy", "fsdp",
            "--epochs", "2", "--checkpoint-every", "8", "--", "--step-sleep", "0.1"]
    job = Job(*args, env=env)
    try:
        job.wait_for("checkpoint ckpt-00000008 committed")
        job.send(signal.SIGTERM)
        assert job.wait(240) == 143, job.output()[-4000:]
    finally:
        job.cleanup()
    for _step, path in checkpoints.committed(f"{out}/checkpoints"):
        assert "__1_0.distcp" in checkpoints.read_marker(path)["files"]
        checkpoints.verify(path)
    proc = entrypoint(*args, env=env, timeout=600)
    assert proc.returncode == 0, failure_text(proc)
    assert "resumed from gs://" in proc.stdout
    local = tmp_path / "model.safetensors"
    local.write_bytes(RemotePath(f"{out}/model/model.safetensors").read_bytes())
    assert "tok.weight" in safetensors_torch.load_file(str(local))


@pytest.mark.parametrize("world", [2, 3])
def test_the_export_streams_uneven_shards_into_the_same_bytes_as_the_whole_state(tmp_path: Path, world: int) -> None:
    """Rows no world divides (10, 7, 1): each shard streamed to rank 0 in mesh order gives the full tensors."""
    proc = entrypoint("run", "--framework", "pytorch", "--script", "tests/pytorch/export_shards_script.py",
                      "--nproc-per-node", str(world), "--job-dir", str(tmp_path / "job"), "--timeout", "120", "--",
                      str(tmp_path))
    assert proc.returncode == 0, failure_text(proc)
    exported = safetensors_torch.load_file(str(tmp_path / "model.safetensors"))
    full = torch.load(tmp_path / "full.pt")
    assert sorted(exported) == sorted(full)
    for name, value in full.items():
        assert torch.equal(exported[name], value), name
    streamed = (tmp_path / "streamed.txt").read_text().split()
    assert "0.weight" in streamed and "1.weight" in streamed and "scale" not in streamed, streamed
