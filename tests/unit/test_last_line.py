"""Every last line is capped: a value's repr or a very long name never floods it; the record keeps the message.

The line keeps its shape (``entrypoint: error: <class> on <replica>, rank N, host H: <message> (exit N, kind)``),
and a long message is cut in its middle, so its start (the exception's type) and its end (a note) stay.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from entrypoint import failures
from entrypoint.failures.records import FailureRecord
from tests.conftest import PYTHON, ROOT, subprocess_env

CAP = failures.LAST_LINE_CHARS
SHAPE = re.compile(r"^entrypoint: error: (\w+) on (\S+?)(, rank \d+)?, host (\S+): (.+) \(exit (\d+), "
                   r"(retryable|permanent)\)$")
# What Keras 3's model.fit raised across two workers before the refusal (the tensor's values, whole).
ROWS = "\n".join("       [" + ", ".join(f"{(i * 8 + j) / 7 - 4:.8f}" for j in range(8)) + "]," for i in range(8))
PER_REPLICA = ("Attempt to convert a value (PerReplica:{\n  0: <tf.Tensor: shape=(8, 8), dtype=float32, numpy=\n"
               f"array([{ROWS[7:]}], dtype=float32)>\n}}) with an unsupported type "
               "(<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor.")
LONG_NAME = "a" * 5000


def _record(message: str, rank: int | None = 1, exit_code: int = 1) -> FailureRecord:
    return FailureRecord(replica="workerpool1-0", rank=rank, host="workerpool1-0-host", failure_class="user_code",
                         exit_code=exit_code, message=message)


def test_a_repr_flooded_message_is_cut_in_the_middle_and_the_line_keeps_its_shape() -> None:
    message = failures.classify(ValueError(PER_REPLICA)).message
    assert len(message) > 2 * CAP  # the record keeps it whole (on one line)
    assert message.startswith("ValueError: Attempt to convert") and message.endswith("to a Tensor.")
    line = _record(message).last_line()
    assert len(line) <= CAP and "\n" not in line
    found = SHAPE.match(line)
    assert found is not None, line
    assert found.groups()[:4] == ("user_code", "workerpool1-0", ", rank 1", "workerpool1-0-host")
    assert found.group(5).startswith("ValueError: Attempt to convert a value (PerReplica:{ 0: <tf.Tensor")
    assert found.group(5).endswith("(<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor.")
    assert " [...] " in line and line.endswith("(exit 1, permanent)")


def test_a_note_survives_the_cut_and_short_messages_are_unchanged() -> None:
    noted = _record(LONG_NAME, rank=None, exit_code=137).noted("no restart: --restart-policy never")
    line = noted.last_line()
    assert len(line) <= CAP and line.endswith("; no restart: --restart-policy never (exit 137, retryable)")
    assert _record("ValueError: x").last_line() == ("entrypoint: error: user_code on workerpool1-0, rank 1, host "
                                                    "workerpool1-0-host: ValueError: x (exit 1, permanent)")


@pytest.mark.parametrize("size", [0, 1, 119, 120, 121, 400, 401, 5000])
def test_clip_keeps_the_limit_the_start_and_the_end(size: int) -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(size))
    clipped = failures.clip(text, 200)
    assert len(clipped) <= 200
    assert clipped == text if size <= 200 else (clipped.startswith(text[:100]) and clipped.endswith(text[-50:]))
    assert len(failures.clip(text, 10)) <= 120  # a message keeps 120 characters whatever the line's own words


def test_a_commands_one_line_error_is_capped() -> None:
    line = failures.error_line(f"--module: cannot find module {LONG_NAME!r}")
    assert line.startswith("entrypoint: error: --module: cannot find module 'aaa") and len(line) <= CAP


def _entrypoint(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "entrypoint", *args], cwd=cwd, env=subprocess_env(), capture_output=True,
                          text=True, timeout=120)


def test_a_5000_character_module_name_ends_run_with_a_capped_line_and_a_whole_record(tmp_path: Path) -> None:
    job = tmp_path / "job"
    proc = _entrypoint("run", "--framework", "pytorch", "--job-dir", str(job), "--module", LONG_NAME, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines[-1]) <= CAP and SHAPE.match(lines[-1]), lines[-1][:600]
    assert "cannot find module 'aaa" in lines[-1] and lines[-1].endswith("(exit 2, permanent)")
    [record] = [json.loads(p.read_text()) for p in (job / "failures").glob("*.json")]
    assert LONG_NAME in record["message"]  # the record keeps the whole message


@pytest.mark.parametrize("command", [
    ["describe", "--framework", "pytorch", "--module", LONG_NAME],
    ["doctor", "--framework", "pytorch", "--module", LONG_NAME],
    ["local", "--workers", "1", "--output-dir", "{out}", "--", "run", "--framework", "pytorch", "--module",
     LONG_NAME],
    ["job", "kubeflow", "--kind", "pytorchjob", "--image", "x", "--env", f"A{LONG_NAME}=1", "--env",
     f"A{LONG_NAME}=1", "--", "--framework", "pytorch", "--module", "m"],
], ids=["describe", "doctor", "local", "job"])
def test_a_5000_character_value_ends_every_command_with_a_capped_line(tmp_path: Path, command: list[str]) -> None:
    proc = _entrypoint(*[a.replace("{out}", str(tmp_path / "out")) for a in command], cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("entrypoint: error: ") and len(last) <= CAP, last[:600]
    assert "aaaa [...] aaaa" in last
