"""Run the entrypoint as a real process and read what the job wrote (shared by every framework's tests)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tests.conftest import PYTHON, ROOT, subprocess_env


def entrypoint(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m entrypoint ARGS`` from the repo root, output captured."""
    return subprocess.run([PYTHON, "-m", "entrypoint", *args], cwd=ROOT, env=subprocess_env(env),
                          capture_output=True, text=True, timeout=timeout)


def summary(model_dir: Path) -> dict[str, Any]:
    """The chief's training summary."""
    data: dict[str, Any] = json.loads((model_dir / "training_summary.json").read_text())
    return data


def hypertune_files(output: Path) -> list[Path]:
    """Every hypertune metrics file any replica wrote (each emulated replica has its own /tmp)."""
    return sorted(output.glob(".replicas/*/hypertune/output.metrics"))


def failure_text(proc: subprocess.CompletedProcess[str]) -> str:
    """The tail of a failed run's output for an assertion message."""
    return f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


MARKER_VARIABLE = "TRAINER_TEST_MARKER"
PROGRESS = re.compile(r"epoch \d+/\d+ step (\d+)/\d+")


class Job:
    """``python -m entrypoint ARGS`` running in the background; its output lines collected as they come.

    Every process it starts inherits a unique marker variable, so a test can tell which are left.
    """

    def __init__(self, *args: str, env: dict[str, str] | None = None, unset: tuple[str, ...] = ()) -> None:
        self.marker = uuid.uuid4().hex
        self.lines: list[str] = []
        child = subprocess_env({**(env or {}), MARKER_VARIABLE: self.marker})
        for name in unset:  # a variable the tests' environment sets that this job must not see
            child.pop(name, None)
        self.proc = subprocess.Popen([PYTHON, "-m", "entrypoint", *args], cwd=ROOT, env=child,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 180) -> re.Match[str]:
        """The first output line matching ``pattern`` (waiting for it; fails if the job ends first)."""
        regex, seen, deadline = re.compile(pattern), 0, time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines[seen:]:
                if match := regex.search(line):
                    return match
            seen = len(self.lines)
            if self.proc.poll() is not None and not self._reader.is_alive() and seen == len(self.lines):
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r}:\n{self.output()[-4000:]}")

    def wait_for_step(self, step: int, timeout: float = 180) -> int:
        """Block until a progress line shows ``step`` or later; that step."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (last := self.last_step()) >= step:
                return last
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no progress line reached step {step}:\n{self.output()[-4000:]}")

    def last_step(self) -> int:
        """The highest step any progress line showed."""
        return max((int(m.group(1)) for line in self.lines if (m := PROGRESS.search(line))), default=0)

    def send(self, sig: int) -> float:
        """Signal the job's main process (as a container runtime signals PID 1's child); when it was sent."""
        self.proc.send_signal(sig)
        return time.monotonic()

    def wait(self, timeout: float = 120) -> int:
        """The job's exit code (as the shell reports it)."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return 128 - code if code < 0 else code

    def output(self) -> str:
        """Everything the job printed so far."""
        return "\n".join(self.lines)

    def left(self) -> list[int]:
        """Processes started by this job that are still alive."""
        return processes_with(self.marker)

    def cleanup(self) -> None:
        """Kill whatever the job left (a failed test must not leak processes)."""
        for pid in [self.proc.pid, *self.left()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def processes_with(marker: str, where: str = "environ") -> list[int]:
    """Live processes whose environment (``where="cmdline"``: command line) carries ``marker`` (zombies excluded)."""
    needle = (f"{MARKER_VARIABLE}={marker}" if where == "environ" else marker).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / where).read_bytes() and "\nState:\tZ" not in (entry / "status").read_text():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_gone(marker: str, timeout: float = 20) -> list[int]:
    """Wait until no process carries ``marker``; those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    while (alive := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


def failure_records(job_dir: Path) -> list[dict[str, Any]]:
    """The failure records the job wrote, oldest first."""
    return [json.loads(p.read_text()) for p in sorted((job_dir / "failures").glob("*.json"))]


def last_line(proc: subprocess.CompletedProcess[str] | Job) -> str:
    """The last line a job printed on stderr (or, for a background job, on its combined output)."""
    text = proc.output() if isinstance(proc, Job) else proc.stderr
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def replica_group(job: Job, replica: str) -> int:
    """The process group (its session leader's pid) of an emulated replica's current attempt, children included.

    The replica's entrypoint is the one ``local`` (the job's process) started: its ranks lead sessions of their own
    too (torch's agent, the fork server), and the lowest pid is not the oldest process once pids wrapped (pid_max
    32768: a full test run wraps them every few minutes)."""
    leaders = []
    for pid in job.left():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if f"TRAINER_REPLICA={replica}".encode() in environ and int(stat[2]) == pid:
            leaders.append((int(stat[1]) != job.proc.pid, int(stat[19]), pid))  # local's child first, then oldest
    if leaders:
        return min(leaders)[2]
    raise AssertionError(f"no process group for {replica}:\n{job.output()[-2000:]}")


def vanish(job: Job, replica: str) -> float:
    """SIGKILL a replica's whole process tree, as a VM that disappears (no SIGTERM, no grace); when."""
    os.killpg(replica_group(job, replica), signal.SIGKILL)
    return time.monotonic()


def assert_restarted_in_place(job: Job, *victims: str, timeout: float = 420) -> str:
    """The job ended 0 after ``local`` restarted each of ``victims`` once in place, and left no process; its
    output."""
    assert job.wait(timeout) == 0, job.output()[-4000:]
    assert wait_gone(job.marker) == []
    output = job.output()
    for victim in victims:
        assert re.search(rf"\[local\] {victim} exited 137 \(retryable\): restart 1 of 5", output), output[-3000:]
        assert f"[{victim}#1]" in output  # the restarted replica's lines show its attempt
    return output


def assert_export_is_newest_checkpoint(out: Path) -> dict[str, Any]:
    """A PyTorch hooks job under ``out``: the newest committed checkpoint is the summary's last (and expected) step
    and the exported weights are its weights; the summary."""
    import torch  # only where the job was a PyTorch one: this module is shared by every framework's venv

    from entrypoint.outputs import checkpoints

    result = summary(out / "model")
    newest = checkpoints.committed(out / "checkpoints", warn=False)[-1]
    assert newest[0] == result["final_step"] == result["expected_steps"]
    saved = torch.load(newest[1] / "state.pt", weights_only=False)["model"]
    exported = torch.load(out / "model" / "state_dict.pt")
    assert all(torch.equal(saved[k], exported[k]) for k in saved)
    return result
