"""Successful jobs end cleanly: every replica finishes together, the chief's store outlives its peers, nothing is
logged at error level, and torch's gloo teardown cannot turn a finished training into a failure."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT, subprocess_env
from tests.runs import Job, entrypoint, failure_text, last_line, processes_with

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
RUN = ["run", "--framework", "pytorch", "--timeout", "120"]
PATHS = pytest.mark.parametrize("nproc", ["1", "2"], ids=["in-process", "torch-agent"])
# An error-level line from us, torch (glog "E1123 ...", logging's "ERROR"), gloo or the C++ runtime.
ERROR_LINE = re.compile(r"(\] |^)E\d{4} |\bERROR\b|Traceback|terminate called|Fatal Python error|entrypoint: error")


def error_lines(text: str) -> list[str]:
    """Lines of a successful job's output that look like errors (there must be none)."""
    return [line for line in text.splitlines() if ERROR_LINE.search(line)]


@PATHS
def test_a_successful_ddp_script_logs_no_error_line(tmp_path: Path, nproc: str) -> None:
    out = tmp_path / "script-out"
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(tmp_path), "--", *RUN, "--nproc-per-node", nproc,
                      "--script", "tests/pytorch/ddp_script.py", "--", "--out", str(out))
    assert proc.returncode == 0, failure_text(proc)
    result = json.loads((out / "result.json").read_text())
    assert result["world_size"] == 2 * int(nproc) and len(set(result["digests"])) == 1
    assert error_lines(proc.stdout + proc.stderr) == []


@pytest.mark.parametrize("switch", ["1", "0"], ids=["forked", "execed"])
def test_a_gloo_group_destroyed_with_a_collective_in_flight_does_not_deadlock_its_rank(tmp_path: Path,
                                                                                        switch: str) -> None:
    # torch 2.13's ~ProcessGroupGloo joins its worker holding the GIL while the worker waits for it to free a work
    # (tests/pytorch/gloo_teardown_deadlock.py): the worker keeps every destroyed gloo group alive to its end. Without
    # that, this job hangs every time; a DDP script's end hung there 2 times in 5 under load (the fork server's).
    out = tmp_path / "out"
    proc = entrypoint(*RUN, "--nproc-per-node", "2", "--job-dir", str(tmp_path / "job"), "--script",
                      "tests/pytorch/gloo_teardown_deadlock.py", "--", str(out), env={"TRAINER_FORK_SERVER": switch},
                      timeout=150)
    assert proc.returncode == 0, failure_text(proc)
    assert sorted(p.name for p in out.iterdir()) == ["done-0", "done-1"]
    assert error_lines(proc.stdout + proc.stderr) == []


@PATHS
def test_a_script_that_returned_normally_is_not_failed_by_torchs_teardown(tmp_path: Path, nproc: str) -> None:
    # The abort this guards against came 1 time in 8 before (docs/ARCHITECTURE.md): the same script ends the same way
    # a second time on each path in test_the_chief_leaves_after_every_peer_finished, with the same assertions.
    out = tmp_path / "out"
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(tmp_path / "job"), "--", *RUN,
                      "--nproc-per-node", nproc, "--script", "tests/pytorch/teardown_script.py", "--", str(out))
    assert proc.returncode == 0, failure_text(proc)
    assert sorted(p.name for p in out.iterdir()) == [f"done-{r}.json" for r in range(2 * int(nproc))]
    assert error_lines(proc.stdout + proc.stderr) == []


def test_a_chief_whose_script_ends_with_os_exit_fails_no_peer(tmp_path: Path) -> None:
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(tmp_path), "--", *RUN, "--script",
                      "tests/pytorch/quick_exit_script.py")
    assert proc.returncode == 0, failure_text(proc)
    assert "rank 0 leaves" in proc.stdout and "rank 1 leaves" in proc.stdout
    assert "the job's store on node 0 went away before every node finished" in proc.stdout + proc.stderr


def _replica_process(marker: str, replica: str) -> int | None:
    """The ``python -m entrypoint run`` process of ``replica`` among the job's processes."""
    for pid in processes_with(marker):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"TRAINER_REPLICA={replica}".encode() in environ and cmdline[1:4] == [b"-m", b"entrypoint", b"run"]:
            return pid
    return None


@PATHS
def test_the_chief_leaves_after_every_peer_finished(tmp_path: Path, nproc: str) -> None:
    out, late = tmp_path / "out", 4.0  # the worker node's ranks finish 4 s after the chief's
    job = Job("local", "--workers", "2", "--output-dir", str(tmp_path / "job"), "--", *RUN, "--nproc-per-node", nproc,
              "--script", "tests/pytorch/teardown_script.py", "--", str(out), str(late))
    try:
        deadline, chief = time.monotonic() + 180, None
        while chief is None and time.monotonic() < deadline and job.proc.poll() is None:
            chief = _replica_process(job.marker, "workerpool0-0")
            time.sleep(0.05)
        assert chief is not None, job.output()[-3000:]
        while Path(f"/proc/{chief}").exists() and "\nState:\tZ" not in _status(chief):
            time.sleep(0.05)
        chief_left = time.time()
        assert job.wait(timeout=180) == 0, job.output()[-3000:]
    finally:
        job.cleanup()
    done = {int(p.stem.split("-")[1]): json.loads(p.read_text())["time"] for p in out.glob("done-*.json")}
    assert sorted(done) == list(range(2 * int(nproc)))
    # the scenario held: the last node's ranks worked on after the others (half of LATE: a loaded machine delays writes)
    assert chief_left >= max(done.values()) >= min(done.values()) + late * 0.5, done
    assert error_lines(job.output()) == []


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "\nState:\tZ"


def test_ending_a_process_with_gloo_threads_runs_exit_handlers_and_flushes_files(tmp_path: Path) -> None:
    code = f"""
import atexit, os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from entrypoint.lifecycle.shutdown import end, native_threads
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(2, 1))  # DDP keeps the group (and its threads) alive
model(torch.ones(1, 2)).sum().backward()
dist.destroy_process_group()
assert native_threads(), "gloo's threads outlive destroy_process_group under DDP"
log = open({str(tmp_path / "unflushed.txt")!r}, "w")
log.write("written, never flushed nor closed")
atexit.register(lambda: open({str(tmp_path / "atexit.txt")!r}, "w").write("ran"))
print("bye", end="")
end(3)
"""
    from entrypoint.lifecycle.startup.ports import free_ports

    proc = subprocess.run([PYTHON, "-c", code, str(free_ports(1)[0])], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert proc.stdout == "bye"
    assert (tmp_path / "unflushed.txt").read_text() == "written, never flushed nor closed"
    assert (tmp_path / "atexit.txt").read_text() == "ran"


def test_a_process_a_rank_left_behind_is_killed_and_the_node_ends_with_the_ranks_cause(tmp_path: Path) -> None:
    left = tmp_path / "left.pid"
    proc = entrypoint(*RUN, "--nproc-per-node", "2", "--job-dir", str(tmp_path / "job"), "--script",
                      "tests/pytorch/orphan_script.py", "--", str(left), timeout=120)  # the one left sleeps 300 s
    assert proc.returncode == 3, failure_text(proc)
    assert "rank 0 leaves" in proc.stdout and "user_code" in last_line(proc), failure_text(proc)
    assert f"killed process {left.read_text()} a rank left behind" in proc.stdout + proc.stderr
    assert not Path(f"/proc/{left.read_text()}").exists()
