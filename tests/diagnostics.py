"""Where to look when a test fails: a pytest plugin (tests/conftest.py loads it) that adds to a failed test's report
the output of every process the test started, grouped by replica, and the failure records its jobs wrote.

A red CI run then reads without a rerun: pytest prints these sections under the test's traceback, and
tests/tiers.py prints a failed tier's failures in the CI log.

- **Processes.** While a test runs, every ``subprocess.Popen`` it starts (``subprocess.run``, ``tests.runs.Job``, the
  container engine, ...) is recorded: its command, pid and exit code, and the output the test read from it (a pipe
  the test reads is passed through unchanged; the lines are kept on the side, the last ``KEEP_LINES`` of each
  process). The report shows, per process, the last lines of each replica (``[workerpool0-0]``, ``[local]``, ...).
- **Failure records.** Every ``failures/*.json`` under the test's ``tmp_path`` (docs/OUTPUTS.md), one line each:
  replica, class, exit code, step and message, with the traceback's last lines.
- **Other logs** under ``tmp_path`` (``*.log``, e.g. the GCS emulator's): their last lines.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections import deque
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

KEEP_LINES = 2000  # per process, the newest
REPLICA_LINES = 30  # shown per replica of a process
PROCESS_LINES = 150  # shown per process at most
TOTAL_LINES = 800  # shown per failed test at most (the newest processes first)
PREFIX = re.compile(r"^\[([\w.:#@/-]+)\] ")


class Recorded:
    """One process a test started: its command and the output read from it so far."""

    def __init__(self, args: Any) -> None:
        self.args = args
        self.proc: subprocess.Popen[Any] | None = None
        self.lines: deque[str] = deque(maxlen=KEEP_LINES)
        self.total = 0  # lines
        self.chars = 0
        self._partial = ""

    def add(self, data: str | bytes | None) -> None:
        if not data:
            return
        text = data.decode(errors="replace") if isinstance(data, bytes) else data
        self.chars += len(text)
        parts = (self._partial + text).split("\n")
        self._partial = parts.pop()
        self.lines.extend(parts)
        self.total += len(parts)

    def all_lines(self) -> list[str]:
        return [*self.lines, *([self._partial] if self._partial else [])]

    def command(self) -> str:
        args = self.args
        text = args if isinstance(args, str | bytes) else shlex.join(str(a) for a in args)
        text = text.decode(errors="replace") if isinstance(text, bytes) else text
        return text if len(text) <= 300 else text[:297] + "..."


class RecordingStream:
    """A pipe of a recorded process: every read passes through unchanged and is kept on the side."""

    def __init__(self, stream: Any, record: Recorded) -> None:
        self._stream, self._record = stream, record

    def __iter__(self) -> Iterator[Any]:
        for line in self._stream:
            self._record.add(line)
            yield line

    def __next__(self) -> Any:
        line = next(self._stream)
        self._record.add(line)
        return line

    def readline(self, *args: Any) -> Any:
        line = self._stream.readline(*args)
        self._record.add(line)
        return line

    def readlines(self, *args: Any) -> Any:
        lines = self._stream.readlines(*args)
        for line in lines:
            self._record.add(line)
        return lines

    def read(self, *args: Any) -> Any:
        data = self._stream.read(*args)
        self._record.add(data)
        return data

    def read1(self, *args: Any) -> Any:
        data = self._stream.read1(*args)
        self._record.add(data)
        return data

    def __enter__(self) -> RecordingStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


_ORIGINAL_INIT = subprocess.Popen.__init__
_ORIGINAL_COMMUNICATE = subprocess.Popen.communicate
RECORDS = pytest.StashKey[list[Recorded]]()


@pytest.fixture(autouse=True)
def record_processes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Recorded]]:
    """Record every process the test starts (see the module's docstring); the list is the test's, in start order."""
    records: list[Recorded] = []
    request.node.stash[RECORDS] = records

    def init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        _ORIGINAL_INIT(self, *args, **kwargs)
        record = Recorded(args[0] if args else kwargs.get("args"))
        record.proc = self
        records.append(record)
        self._trainer_record = record  # type: ignore[attr-defined]
        for name in ("stdout", "stderr"):
            stream = getattr(self, name)
            if stream is not None:
                setattr(self, name, RecordingStream(stream, record))

    def communicate(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> Any:
        record: Recorded | None = getattr(self, "_trainer_record", None)
        seen = record.chars if record else 0
        out, err = _ORIGINAL_COMMUNICATE(self, *args, **kwargs)
        if record is not None and record.chars == seen:  # several pipes: read past the streams, keep it here
            record.add(out)
            record.add(err)
        return out, err

    monkeypatch.setattr(subprocess.Popen, "__init__", init)
    monkeypatch.setattr(subprocess.Popen, "communicate", communicate)
    yield records


def replica_tails(lines: list[str]) -> list[str]:
    """The last lines of each replica (by its ``[name]`` prefix; unprefixed lines are the process's own)."""
    groups: dict[str, list[str]] = {}
    for line in lines:
        match = PREFIX.match(line)
        groups.setdefault(match.group(1) if match else "", []).append(line)
    if len(groups) == 1:
        return lines[-PROCESS_LINES:]
    shown: list[str] = []
    for name, group in groups.items():
        title = f"[{name}]" if name else "(its own lines)"
        cut = f", the last {REPLICA_LINES}" if len(group) > REPLICA_LINES else ""
        shown.append(f"--- {title}: {len(group)} lines{cut}")
        shown.extend(group[-REPLICA_LINES:])
    return shown[-PROCESS_LINES:]


def processes_section(records: list[Recorded]) -> str:
    blocks: list[list[str]] = []
    for number, record in enumerate(records, 1):
        proc = record.proc
        code = None if proc is None else proc.poll()
        state = "still running" if code is None else f"exit {code}"
        lines = record.all_lines()
        head = f"=== process {number} of {len(records)} (pid {proc.pid if proc else '?'}, {state}, {record.total} " \
               f"lines read): {record.command()}"
        blocks.append([head, *(replica_tails(lines) if lines else ["(no output read by the test)"])])
    shown: list[list[str]] = []
    budget = TOTAL_LINES
    for block in reversed(blocks):  # the newest processes first, within the budget
        if budget <= 0:
            shown.append([f"... {len(blocks) - len(shown)} earlier process(es) not shown"])
            break
        shown.append(block[:budget])
        budget -= len(block)
    return "\n".join(line for block in reversed(shown) for line in block)


def failure_records_section(root: Path) -> str:
    lines: list[str] = []
    for path in sorted(root.rglob("failures/*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            lines.append(f"{path.relative_to(root)}: unreadable ({exc})")
            continue
        lines.append(f"{path.relative_to(root)}: {record.get('replica')} rank {record.get('rank')} "
                     f"step {record.get('step')}: {record.get('class')} exit {record.get('exit_code')}: "
                     f"{record.get('message')}")
        traceback = str(record.get("traceback") or "").strip().splitlines()
        lines.extend(f"    {line}" for line in traceback[-8:])
    return "\n".join(lines)


def logs_section(root: Path) -> str:
    lines: list[str] = []
    for path in sorted(root.rglob("*.log")):
        try:
            text = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        lines.append(f"--- {path.relative_to(root)}: {len(text)} lines{', the last 20' if len(text) > 20 else ''}")
        lines.extend(text[-20:])
    return "\n".join(lines)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                                            pytest.TestReport]:
    report = yield
    if report.failed:
        add_where_to_look(item, report)
    return report


def add_where_to_look(item: pytest.Item, report: pytest.TestReport) -> None:
    records = item.stash.get(RECORDS, [])
    if records:
        report.sections.append((f"where to look: the {len(records)} process(es) the test started, by replica",
                                processes_section(records)))
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if isinstance(tmp_path, Path) and tmp_path.exists():
        records_text = failure_records_section(tmp_path)
        if records_text:
            report.sections.append((f"where to look: failure records under {tmp_path}", records_text))
        logs = logs_section(tmp_path)
        if logs:
            report.sections.append((f"where to look: logs under {tmp_path}", logs))
