"""The ``CheckpointWriter`` contract, with a toy writer of plain files (no framework): marker last, resume, fallback."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from entrypoint.outputs import checkpoints
from entrypoint.outputs.storage import Location


class FileWriter:
    """A ``CheckpointWriter`` whose state is ``{file name: bytes}``, written synchronously as plain files."""

    def __init__(self, keep: int) -> None:
        self.retention = checkpoints.Retention(keep)
        self.blocked_seconds = 0.0
        self.write_seconds = 0.0
        self.fail_after: int | None = None  # files written before a simulated crash

    def save(self, path: Location, state: Any, meta: dict[str, Any]) -> None:
        started = time.perf_counter()
        path.mkdir(parents=True, exist_ok=True)
        for i, (name, data) in enumerate(state.items()):
            if self.fail_after is not None and i >= self.fail_after:
                raise OSError("the disk went away")
            (path / name).write_bytes(data)
        checkpoints.commit(path, meta)
        self.retention.verified(path)
        self.retention.prune(path.parent)
        elapsed = time.perf_counter() - started
        self.blocked_seconds += elapsed
        self.write_seconds += elapsed

    def wait(self) -> None:
        pass

    def check(self) -> None:
        pass

    def load(self, path: Location, into: dict[str, bytes]) -> int:
        into.clear()
        into.update({p.name: p.read_bytes() for p in Path(str(path)).iterdir() if p.name != checkpoints.MARKER})
        return int(checkpoints.read_marker(path)["step"])


STATE = {"model.bin": b"weights" * 100, "optimizer.bin": b"moments" * 50}


def save(writer: checkpoints.CheckpointWriter, root: Path, step: int, state: dict[str, bytes] = STATE) -> Path:
    path = checkpoints.checkpoint_path(root, step)
    writer.save(path, state, {"step": step})
    writer.wait()
    return Path(str(path))


def test_the_marker_is_written_last_and_lists_every_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[set[str]] = []
    commit = checkpoints.commit

    def spy(path: Location, meta: dict[str, Any], files: dict[str, Any] | None = None) -> None:
        seen.append({p.name for p in Path(str(path)).iterdir()})  # what exists when the marker is written
        commit(path, meta, files)

    monkeypatch.setattr(checkpoints, "commit", spy)
    writer = FileWriter(keep=3)
    path = save(writer, tmp_path, 10)
    assert seen == [set(STATE)]
    assert set(checkpoints.read_marker(path)["files"]) == set(STATE)
    checkpoints.verify(path)
    assert writer.blocked_seconds == writer.write_seconds > 0


def test_a_save_that_fails_midway_leaves_no_marker_and_resume_skips_it(tmp_path: Path) -> None:
    writer = FileWriter(keep=3)
    save(writer, tmp_path, 10)
    writer.fail_after = 1
    with pytest.raises(OSError, match="the disk went away"):
        save(writer, tmp_path, 20, {"model.bin": b"new", "optimizer.bin": b"new"})
    assert not checkpoints.is_committed(checkpoints.checkpoint_path(tmp_path, 20))
    into: dict[str, bytes] = {}
    found = checkpoints.load_newest(tmp_path, None, lambda p: writer.load(p, into), FileWriter(keep=3).retention)
    assert found is not None and found[1] == 10 and into == STATE


def test_resume_falls_back_past_a_corrupt_newest_and_the_next_save_prunes_it_first(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = FileWriter(keep=2)
    for step in (10, 20, 30):
        save(writer, tmp_path, step, {**STATE, "step.txt": str(step).encode()})
    assert [s for s, _ in checkpoints.committed(tmp_path)] == [20, 30]  # retention: keep 2
    newest = checkpoints.checkpoint_path(tmp_path, 30)
    (newest / "model.bin").write_bytes(b"weights")  # truncated after its commit

    restarted = FileWriter(keep=2)  # a new process: resume through the writer's load and retention
    into: dict[str, bytes] = {}
    found = checkpoints.load_newest(tmp_path, None, lambda p: restarted.load(p, into), restarted.retention)
    assert found is not None and found[0] == checkpoints.checkpoint_path(tmp_path, 20) and found[1] == 20
    assert into["step.txt"] == b"20"
    assert f"checkpoint {newest} does not load" in caplog.text
    save(restarted, tmp_path, 25)
    assert [s for s, _ in checkpoints.committed(tmp_path)] == [20, 25]  # the bad one went first
    assert "deleting checkpoint" in caplog.text
