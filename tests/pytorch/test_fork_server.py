"""A node's fork server (``entrypoint/pytorch/launch/forkserver.py``) and each rank's client (``forkclient.py``):
a forked rank is the process an exec gives, signals reach it, its exit status comes back, a killed client takes its
rank along, and a server that is gone or refuses leaves the rank to an exec. Real processes: the server imports torch.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from entrypoint.pytorch.launch import forkserver
from tests.conftest import PYTHON, ROOT, subprocess_env
from tests.runs import Job, entrypoint, failure_text

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]

TARGET = "tests.pytorch.fork_target"
NODE_ENV = {"OMP_NUM_THREADS": "1"}  # as a node of several processes sets it (torchrun's default): no OpenMP pool
# What differs between two runs of one job whatever starts its ranks (ports, private paths, the run's tokens)
PER_RUN = {"AIP_CHECKPOINT_DIR", "AIP_MODEL_DIR", "AIP_TENSORBOARD_LOG_DIR", "MASTER_PORT", "TORCHELASTIC_ERROR_FILE",
           "TORCHELASTIC_RUN_ID", "TRAINER_ATTEMPT", "TRAINER_FORK_SERVER", "TRAINER_JOB_LEASE", "TRAINER_PLAN_FILE"}
DRAWS = ("torch_seed", "torch_draw", "python_draw", "numpy_draw", "authkey")  # each process's own


@dataclass
class Served:
    """A fork server and the environment it imported torch with (its clients get the same)."""

    proc: subprocess.Popen[bytes]
    socket: Path
    env: dict[str, str]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Served]:
    """A fork server of this test's process (it dies with it)."""
    served = Served(subprocess.Popen([PYTHON, "-m", "entrypoint.pytorch.launch.forkserver", str(tmp_path / "socket"),
                                      str(os.getpid())], cwd=ROOT, env=(env := subprocess_env(NODE_ENV))),
                    tmp_path / "socket", env)
    try:
        yield served
    finally:
        served.kill()


def client(server: Served, out: Path, *how: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    command = [str(forkserver.CLIENT), str(server.socket), str(server.proc.pid), str(os.getpid()), "-m", TARGET]
    return subprocess.Popen([PYTHON, *command, str(out), *how], cwd=ROOT, env={**server.env, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def started(out: Path, timeout: float = 120) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while not (path := out.with_suffix(".json")).exists():
        assert time.monotonic() < deadline, "the rank never started"
        time.sleep(0.05)
    return dict(json.loads(path.read_text()))


def test_a_forked_rank_runs_the_module_and_its_exit_status_comes_back(server: Served,
                                                                       tmp_path: Path) -> None:
    out = tmp_path / "rank"
    proc = client(server, out, "exit", "3")
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 3, stderr
    assert "target says hello" in stdout  # the client's own standard streams
    rank = started(out)
    assert rank["torch_preloaded"], "the rank was not forked from the server"
    assert rank["argv"] == [str(ROOT / "tests/pytorch/fork_target.py"), str(out), "exit", "3"]  # as -m sets it
    assert rank["orig_argv"] == [PYTHON, "-m", TARGET, str(out), "exit", "3"]
    assert rank["cwd"] == str(ROOT)
    assert "fork server" not in stderr


def test_a_sigterm_to_the_client_reaches_its_rank(server: Served, tmp_path: Path) -> None:
    out = tmp_path / "rank"
    proc = client(server, out, "wait")
    assert started(out)["torch_preloaded"]
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 7, stderr  # the rank's own handler ran, and its exit came back
    assert out.with_suffix(".term").read_text() == str(int(signal.SIGTERM))


def test_a_rank_killed_by_a_signal_ends_its_client_by_the_same_signal(server: Served,
                                                                       tmp_path: Path) -> None:
    proc = client(server, tmp_path / "rank", "raise", "SIGUSR1")
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGUSR1, stderr


def test_a_sigkilled_client_takes_its_rank_with_it(server: Served, tmp_path: Path) -> None:
    out = tmp_path / "rank"
    proc = client(server, out, "wait")
    rank = int(started(out)["pid"])  # type: ignore[call-overload]
    proc.kill()
    proc.wait()
    assert _gone(rank, 10), "the rank outlived its SIGKILLed client"
    assert server.proc.poll() is None  # the server serves on


def test_a_server_killed_while_a_rank_runs_ends_it_and_says_so_in_one_line(server: Served,
                                                                           tmp_path: Path) -> None:
    out = tmp_path / "rank"
    proc = client(server, out, "wait")
    rank = int(started(out)["pid"])  # type: ignore[call-overload]
    server.kill()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert [line for line in stderr.splitlines() if "fork server" in line] == [
        line for line in stderr.splitlines() if line.strip()], stderr
    assert "fork server ended while this rank ran" in stderr
    assert _gone(rank, 10)


def test_without_a_server_each_rank_is_execed_and_that_is_said_once(server: Served,
                                                                      tmp_path: Path) -> None:
    server.kill()
    procs = [client(server, tmp_path / f"rank{n}", "exit", "0") for n in range(2)]
    stderrs = [proc.communicate(timeout=120)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], stderrs
    assert not any(started(tmp_path / f"rank{n}")["torch_preloaded"] for n in range(2))
    said = [line for text in stderrs for line in text.splitlines() if "fork server unavailable" in line]
    assert len(said) == 1, stderrs


def test_a_rank_whose_environment_differs_from_the_servers_is_execed(server: Served,
                                                                      tmp_path: Path) -> None:
    out = tmp_path / "rank"
    proc = client(server, out, "exit", "0", env={"OMP_SCHEDULE": "secret-looking-value"})
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert not started(out)["torch_preloaded"]
    assert "differs from the fork server's in OMP_SCHEDULE" in stderr
    assert "secret-looking-value" not in stderr  # names only


def test_a_rank_whose_attempt_was_set_after_the_server_started_is_forked_with_it(server: Served,
                                                                                 tmp_path: Path) -> None:
    """A worker node sets ``TRAINER_ATTEMPT`` once it sees the chief's ledger, which may be after its server started
    (a restarted node's always was): its ranks were exec'd, each importing torch itself."""
    out = tmp_path / "rank"
    proc = client(server, out, "exit", "0", env={"TRAINER_ATTEMPT": "attempt-2"})
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    found = started(out)
    assert found["torch_preloaded"] and "fork server unavailable" not in stderr, stderr
    assert found["attempt"] == "attempt-2"  # the rank's own environment, not the server's


def test_the_client_imports_the_standard_library_only() -> None:
    tree = ast.parse(forkserver.CLIENT.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def _probe(tmp_path: Path, switch: str) -> dict[int, dict[str, object]]:
    out = tmp_path / f"probe-{switch}"
    proc = entrypoint("run", "--framework", "pytorch", "--timeout", "120", "--nproc-per-node", "2", "--script",
                      "tests/pytorch/process_probe.py", "--job-dir", str(tmp_path / f"job-{switch}"), "--", str(out),
                      env={"TRAINER_FORK_SERVER": switch})
    assert proc.returncode == 0, failure_text(proc)
    assert "fork server unavailable" not in proc.stderr + proc.stdout
    return {rank: json.loads((out / f"process-{rank}.json").read_text()) for rank in (0, 1)}


def test_a_forked_rank_is_the_process_an_exec_gives_and_the_switch_turns_it_off(tmp_path: Path) -> None:
    forked, execed = _probe(tmp_path, "1"), _probe(tmp_path, "0")
    for rank in (0, 1):
        mine, theirs = forked[rank], execed[rank]
        assert mine.pop("parent") == ["-m", "entrypoint.pytorch.launch.forkserver"]
        assert theirs.pop("parent") == ["-m", "entrypoint"]  # switched off: torch's agent (our run) exec'd it
        env, reference = mine.pop("env"), theirs.pop("env")
        assert isinstance(env, dict) and isinstance(reference, dict)
        assert {name for name in env.keys() | reference.keys() if env.get(name) != reference.get(name)} <= PER_RUN
        mine["argv"], theirs["argv"] = mine["argv"][:1], theirs["argv"][:1]  # type: ignore[index]  # OUT differs
        assert {key: value for key, value in mine.items() if key not in DRAWS} == \
               {key: value for key, value in theirs.items() if key not in DRAWS}
    for draw in DRAWS:  # each process its own random state, as each exec'd process has
        assert forked[0][draw] != forked[1][draw], draw
        assert execed[0][draw] != execed[1][draw], draw


TICK = re.compile(r"rank \d tick \d+ ([\d.]+)$")


@pytest.mark.parametrize("switch", ["1", "0"], ids=["forked", "execed"])
def test_a_node_sigkilled_by_its_process_group_takes_its_ranks_at_once(tmp_path: Path, switch: str) -> None:
    """The platform's kill (SIGKILL to the node's process group) ends a forked rank as it ends an exec'd one, which
    is in a session of its own and dies with torch's agent: at once, no line of it after the kill."""
    job = Job("run", "--framework", "pytorch", "--timeout", "120", "--nproc-per-node", "2", "--job-dir",
              str(tmp_path / "job"), "--script", "tests/pytorch/ticking_script.py", env={"TRAINER_FORK_SERVER": switch})
    try:
        ranks = {int(job.wait_for(rf"rank {r} pid (\d+) parent").group(1)) for r in (0, 1)}
        job.wait_for(r"rank 0 tick 5 ")
        job.wait_for(r"rank 1 tick 5 ")
        parents = {Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] for pid in ranks}
        assert (parents != {str(job.proc.pid)}) == (switch == "1"), parents  # forked: the fork server's children
        os.killpg(job.proc.pid, signal.SIGKILL)
        killed = time.time()
        started = time.monotonic()
        left = [pid for pid in ranks if not _gone(pid, 2.0)]
        took = time.monotonic() - started
        assert left == [], f"ranks {left} outlived their node's SIGKILL by 2 s"
        assert took < 1.0, f"the ranks outlived their node's SIGKILL by {took:.2f} s"
        job.proc.wait(10)
        job._reader.join(10)  # every line the ranks wrote, up to the pipe's end
        late = [line for line in job.lines if (m := TICK.search(line)) and float(m.group(1)) > killed + 1.0]
        assert late == [], late
    finally:
        job.cleanup()


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False
