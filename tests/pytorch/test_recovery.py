"""A job survives losing a node: `local --restart-policy vertex` restarts a SIGKILLed replica in place, as
Vertex AI does, and the job finishes with exactly one export, a consistent checkpoint and summary, the lost
work on record, and no process left. The replica's whole process tree is killed, as a vanished VM: no
SIGTERM, no grace. Triggers are lines of the job's own output (or a torn checkpoint on disk), never sleeps.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from entrypoint.outputs import checkpoints
from tests.references import faults_digest
from tests.runs import (
    Job,
    assert_export_is_newest_checkpoint,
    assert_restarted_in_place,
    entrypoint,
    failure_text,
    last_line,
    replica_group,
    vanish,
)

torch = pytest.importorskip("torch")  # collected in every venv; these run where torch is
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
HOOKS = ["--module", "tests.pytorch.faults", "--log-every", "2", "--timeout", "120", "--grace-period", "5"]
SLOW = ["--step-sleep", "0.05"]


def local_args(output: Path, run: list[str], *local: str) -> list[str]:
    return ["local", "--workers", "2", "--output-dir", str(output), *local, "--", "run", "--framework", "pytorch",
            *run]




def torn_checkpoint(checkpoint_dir: Path) -> Callable[[], bool]:
    """True while a checkpoint directory exists without its commit marker (a write in progress)."""
    def writing() -> bool:
        return any(p.is_dir() and not checkpoints.is_committed(p) for p in checkpoint_dir.glob(".partial-ckpt-*"))
    return writing


def wait_until(condition: Callable[[], bool], job: Job, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline and job.proc.poll() is None, job.output()[-3000:]
        time.sleep(0.01)


def assert_recovered(job: Job, out: Path, victim: str, hooks: bool = True, resumed: bool = True) -> dict[str, object]:
    """Exit 0, one export, no process left, the restart logged; for hooks, checkpoint and summary agree."""
    output = assert_restarted_in_place(job, victim)
    if not hooks:
        return {}
    assert output.count("exported to ") == 1 or output.count("model exported to") == 1, output[-3000:]
    result = assert_export_is_newest_checkpoint(out)
    if resumed:  # a replica lost before the first checkpoint: the restart starts afresh, nothing to recover
        assert result["recoveries"], "the lost work is on record"
        assert "recovered after losing" in output
    return result


def test_a_lost_worker_mid_epoch_costs_a_restart_and_the_weights_are_bit_identical(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    run = [*HOOKS, "--checkpoint-every", "5", "--recovery", "restart", "--", *SLOW]  # restart the world
    expected = faults_digest(tmp_path_factory, world=2)
    out = tmp_path / "job"
    job = Job(*local_args(out, run))
    try:
        job.wait_for_step(12)
        killed = vanish(job, "workerpool1-0")
        job.wait_for(r"\[local\] workerpool0-0 exited")
        noticed = time.monotonic() - killed
        result = assert_recovered(job, out, "workerpool1-0")
    finally:
        job.cleanup()
    assert noticed < 60, f"the chief noticed the lost worker after {noticed:.0f} s (--timeout is 120)"
    assert result["param_digests"] == [expected, expected]
    (lost,) = result["recoveries"]  # type: ignore[misc]
    assert lost["replica"] == "workerpool1-0" and lost["resumed_from_step"] == 10
    assert lost["lost_at_step"] >= 12 and lost["lost_steps"] == lost["lost_at_step"] - 10


def test_a_lost_worker_mid_epoch_in_place_keeps_the_weights_bit_identical(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Survivors keep training (the default): at world 2 an allreduce sums two floats, in one order, so even the
    step replayed with the new group gives the uninterrupted run's weights bit for bit."""
    run = [*HOOKS, "--checkpoint-every", "5", "--", *SLOW]
    expected = faults_digest(tmp_path_factory, world=2)
    out = tmp_path / "job"
    job = Job(*local_args(out, run))
    try:
        job.wait_for_step(12)
        chief = replica_group(job, "workerpool0-0")
        vanish(job, "workerpool1-0")
        job.wait_for(r"\[workerpool0-0\] .*group re-formed with 2 replicas at step \d+, healed rank 1 from rank 0")
        assert replica_group(job, "workerpool0-0") == chief  # the chief kept its process
        result = assert_recovered(job, out, "workerpool1-0")
    finally:
        job.cleanup()
    assert "[workerpool0-0#1]" not in job.output()
    assert result["param_digests"] == [expected, expected]
    (lost,) = result["recoveries"]  # type: ignore[misc]
    assert lost["how"] == "in_place" and lost["replica"] == "workerpool1-0" and lost["lost_steps"] <= 1


def test_a_lost_chief_mid_epoch_recovers(tmp_path: Path) -> None:
    out = tmp_path / "job"
    job = Job(*local_args(out, [*HOOKS, "--checkpoint-every", "5", "--", *SLOW]))
    try:
        job.wait_for_step(8)
        vanish(job, "workerpool0-0")
        result = assert_recovered(job, out, "workerpool0-0")
    finally:
        job.cleanup()
    (lost,) = result["recoveries"]  # type: ignore[misc]
    assert lost["replica"] == "workerpool0-0" and lost["lost_steps"] is not None
    # The chief was killed between two progress records: the steps it trained after its last one are known from the
    # survivor's failure record, as the recovery knew them; its end from local's record of the SIGKILL.
    report = json.loads(entrypoint("goodput", str(out), "--json").stdout)
    assert report["steps"]["lost"] == lost["lost_steps"], (report["steps"], lost)
    # the replicas' attempts are in the order they started: the two first ones start together, in either order
    chief = next(a for a in report["attempts"] if a["replica"] == "workerpool0-0")
    assert chief["cause"].startswith("signal (exit 137: stopped by SIGKILL"), report["attempts"]


def test_a_chief_lost_while_writing_a_checkpoint_resumes_from_the_previous_one(tmp_path: Path) -> None:
    """A big model written synchronously: SIGKILL while a checkpoint is written beside its place, without its marker;
    the torn one is never resumed from."""
    out = tmp_path / "job"
    job = Job(*local_args(out, [*HOOKS, "--epochs", "1", "--checkpoint-every", "4", "--checkpoint-mode", "sync",
                                "--", "--hidden", "120000"]))
    try:
        job.wait_for("checkpoint ckpt-00000004 committed")
        wait_until(torn_checkpoint(out / "checkpoints"), job)
        vanish(job, "workerpool0-0")
        # what the chief left: the checkpoint it was writing, without its marker (nobody else commits one)
        (torn,) = [p for p in (out / "checkpoints").glob(".partial-ckpt-*") if not checkpoints.is_committed(p)]
        kept = checkpoints.committed(out / "checkpoints", warn=False)[-1]
        assert assert_recovered(job, out, "workerpool0-0")["recoveries"]
    finally:
        job.cleanup()
    # The restarted chief resumed from the newest committed before the torn one ("resumed from" alone is what every
    # resume logs), which is not a checkpoint until it is whole and swapped in
    output = job.output()
    assert f"resumed from {kept[1]} at step {kept[0]}" in output and kept[0] < int(torn.name.split("-")[-1])
    assert f"resumed from {torn.with_name(torn.name.removeprefix('.partial-'))} " not in output, output[-3000:]


def test_a_chief_lost_during_the_start_up_barrier_recovers(tmp_path: Path) -> None:
    out = tmp_path / "job"
    job = Job(*local_args(out, [*HOOKS, "--epochs", "1", "--", *SLOW]))
    try:
        job.wait_for(r"\[workerpool0-0\] .*(waiting for 1 of 1 peers|all 2 replicas are here)")
        vanish(job, "workerpool0-0")
        assert_recovered(job, out, "workerpool0-0", resumed=False)
    finally:
        job.cleanup()


def test_a_chief_lost_after_the_last_commit_exports_once_after_its_restart(tmp_path: Path) -> None:
    out = tmp_path / "job"
    job = Job(*local_args(out, [*HOOKS, "--epochs", "1", "--", "--export-delay", "30"]))
    try:
        job.wait_for(r"\[workerpool0-0\] exporting in 30 s")
        vanish(job, "workerpool0-0")
        job.wait_for(r"\[workerpool0-0#1\] exporting in 30 s", timeout=300)
        result = assert_recovered(job, out, "workerpool0-0")
    finally:
        job.cleanup()
    assert result["start_step"] == result["final_step"]  # nothing left to train: the restart only exported


def test_a_lost_worker_node_with_two_processes_recovers(tmp_path: Path) -> None:
    out = tmp_path / "job"
    job = Job(*local_args(out, [*HOOKS, "--nproc-per-node", "2", "--checkpoint-every", "4", "--", *SLOW]))
    try:
        job.wait_for_step(6)
        vanish(job, "workerpool1-0")
        assert_recovered(job, out, "workerpool1-0")
    finally:
        job.cleanup()


@pytest.mark.parametrize(("nproc", "victim"), [("1", "workerpool0-0"), ("2", "workerpool1-0")])
def test_a_torchrun_style_script_with_a_snapshot_survives_a_lost_node(tmp_path: Path, nproc: str,
                                                                       victim: str) -> None:
    out = tmp_path / "job"
    snapshot = out / "checkpoints" / "snapshot.pt"
    job = Job(*local_args(out, ["--nproc-per-node", nproc, "--timeout", "120", "--grace-period", "5",
                                "--script", "tests/pytorch/snapshot_script.py", "--", "--total-epochs", "4",
                                "--snapshot-path", str(snapshot), "--step-sleep", "0.3"]))
    try:
        job.wait_for(r"Epoch 1 \| Training snapshot saved at")
        vanish(job, victim)
        assert_recovered(job, out, victim, hooks=False)
    finally:
        job.cleanup()
    output = job.output()
    assert "Resuming training from snapshot at Epoch 1" in output
    assert output.count("model written to") == 1 and (out / "model" / "model.pt").is_file()
    assert last_line(job).startswith("[local]")


def test_an_exhausted_restart_budget_names_the_replica_the_restarts_and_the_first_root_cause(tmp_path: Path) -> None:
    proc = entrypoint("local", "--workers", "1", "--max-restarts", "2", "--job-retries", "1", "--output-dir",
                      str(tmp_path), "--", "run", "--framework", "pytorch", "--script",
                      "tests/pytorch/vanishing_script.py", timeout=300)
    assert proc.returncode == 137, failure_text(proc)
    output = proc.stdout + proc.stderr
    assert output.count("): restart 1 of 2") == 2 and "restarting every replica (job restart 1 of 1)" in output
    assert "[workerpool0-0#5]" in output and "[workerpool0-0#6]" not in output
    line = output.strip().splitlines()[-1]
    assert line.startswith("entrypoint: error: signal on workerpool0-0") and "stopped by SIGKILL" in line, line
    assert "workerpool0-0 was restarted 2 times and the job retried 1 times" in line and "(exit 137, retryable)" in line


def test_a_module_that_cannot_be_imported_is_permanent_on_the_first_try(tmp_path: Path) -> None:
    proc = entrypoint(*local_args(tmp_path, ["--module", "tests.pytorch.broken_import"]), timeout=300)
    assert proc.returncode == 1, failure_text(proc)
    output = proc.stdout + proc.stderr
    assert not re.search(r"exited .*: restart", output), output[-3000:]  # a crash loop is not retried
    assert "#1]" not in output
    line = output.strip().splitlines()[-1]  # both replicas fail alike: the one whose record came first is named
    assert re.match(r"entrypoint: error: user_code on workerpool[01]-0, ", line) and \
        "a_package_missing_from_the_image" in line and "(exit 1, permanent)" in line, line
