"""The job's last line and exit code name the latest attempt's cause, with its reason (docs/EXIT_CODES.md).

A failure the job recovered from (a replica SIGKILLed, restarted in place, the job resumed) never outranks a later
end: a SIGTERM then ends `local` and every node 143 `preempted`. A rank's record that the job dir could not take
(it went to the node's temp dir) keeps its reason on the node's and on `local`'s last line. Triggers are lines of
the job's own output, never sleeps.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from tests.pytorch.test_failures import mounted
from tests.runs import Job, entrypoint, failure_text, last_line, vanish, wait_gone

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
# The default grace period: the save on SIGTERM must land within it on a loaded machine too.
HOOKS = ["--module", "tests.pytorch.faults", "--log-every", "2", "--timeout", "120"]


def error_lines(output: str, prefix: str) -> list[str]:
    """The failure lines a replica (``[prefix]``) printed, in order: its ranks' and, last, its node's."""
    return [line for line in output.splitlines() if line.startswith(f"[{prefix}] entrypoint: error: ")]


def test_a_sigterm_after_a_recovered_loss_ends_143_naming_the_preemption_not_the_old_sigkill(tmp_path: Path) -> None:
    out = tmp_path / "job"
    job = Job("local", "--workers", "2", "--output-dir", str(out), "--", "run", "--framework", "pytorch", *HOOKS,
              "--nproc-per-node", "2", "--checkpoint-every", "4", "--epochs", "100", "--", "--step-sleep", "0.05")
    try:
        job.wait_for_step(6)
        vanish(job, "workerpool1-0")
        job.wait_for(r"\[local\] workerpool1-0 exited 137 \(retryable\): restart 1 of 5")
        recovered = job.wait_for(r"\[workerpool0-0\] .*recovered after losing workerpool1-0 at step \d+: "
                                 r"resumed from step (\d+)")
        job.wait_for_step(int(recovered.group(1)) + 4)  # the job trains on after the recovery
        job.send(signal.SIGTERM)
        code = job.wait(240)
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    output = job.output()
    assert code == 143, output[-4000:]
    assert "[local] job finished with exit code 143 after 1 replica restart(s)" in output
    assert re.match(r"entrypoint: error: preempted on workerpool[01]-0, rank \d, host .*\(exit 143, retryable\)$",
                    last_line(job)), last_line(job)
    for node in ("workerpool0-0", "workerpool1-0#1"):  # each node's own last line too (a launcher of two ranks)
        lines = error_lines(output, node)
        assert lines and "preempted on workerpool" in lines[-1] and "(exit 143, retryable)" in lines[-1], lines
    assert "stopped by SIGKILL" not in "\n".join(error_lines(output, "workerpool0-0"))


def test_a_ranks_record_the_job_dir_cannot_take_keeps_its_reason_on_the_last_lines(tmp_path: Path) -> None:
    """The job dir's ``failures`` cannot be made (a file is there): the disk_full record of rank 0 goes to its node's
    temp dir, and both the node (two ranks under its launcher) and `local` name it with its reason."""
    out = tmp_path / "job"
    out.mkdir()
    (out / "failures").write_text("not a directory")
    with mounted("tmpfs", tmp_path / "small") as small:
        proc = entrypoint("local", "--workers", "1", "--output-dir", str(out), "--", "run", "--framework", "pytorch",
                          *HOOKS, "--nproc-per-node", "2", "--checkpoint-dir", str(small), "--epochs", "1", "--",
                          "--hidden", "2048", timeout=600)
    assert proc.returncode == 74, failure_text(proc)
    node = error_lines(proc.stdout, "workerpool0-0")
    assert node and "disk_full on workerpool0-0" in node[-1] and "no space left on device" in node[-1], node
    line = last_line(proc)
    assert line.startswith("entrypoint: error: disk_full on workerpool0-0, rank 0") and str(small) in line, line
    assert "exited with 74" not in line and line.endswith("(exit 74, permanent)"), line


def test_the_disks_a_sigkilled_local_left_are_removed_by_the_next_local(tmp_path: Path) -> None:
    """`local` SIGKILLed (no chance to clean up) leaves its replicas' disks; the next `local` removes them as it starts,
    its owner being gone (docs/recovery.md)."""
    env = {"TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    script = ["--", "run", "--framework", "pytorch", "--script", "tests/pytorch/sleep_script.py"]
    job = Job("local", "--output-dir", str(tmp_path / "job"), *script, env=env)
    try:
        root = Path(job.wait_for(r"each replica's own disk under (\S+);").group(1))
        job.wait_for(r"\[workerpool0-0\] .*outputs: job dir")
        job.proc.kill()
        assert job.wait(60) == 137
        assert wait_gone(job.marker, timeout=60) == []  # its replica died with it
    finally:
        job.cleanup()
    assert (root / "workerpool0-0" / "work").is_dir()  # left behind
    described = ["describe" if a == "run" else a for a in script]
    proc = entrypoint("local", "--output-dir", str(tmp_path / "job"), *described, env=env, timeout=120)
    assert proc.returncode == 0, failure_text(proc)
    assert f"[local] removed 1 replica disk(s) a stopped local left: {root}" in proc.stdout, proc.stdout[-2000:]
    assert not root.exists() and list((tmp_path / "tmp").glob("trainer-local-*")) == []
