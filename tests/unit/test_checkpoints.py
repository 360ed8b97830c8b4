"""Commit markers: a checkpoint counts only once its marker is written; torn ones are skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from entrypoint import checkpoints
from entrypoint.errors import ConfigError


def make(root: Path, step: int, commit: bool = True) -> Path:
    path = checkpoints.checkpoint_path(root, step)
    path.mkdir(parents=True)
    (path / "state.pt").write_bytes(b"x")
    if commit:
        checkpoints.commit(path, {"step": step})
    return path


def test_latest_skips_torn_checkpoints(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    make(tmp_path, 10)
    good = make(tmp_path, 20)
    make(tmp_path, 30, commit=False)
    assert checkpoints.latest(tmp_path) == good
    assert "skipping torn checkpoint" in caplog.text
    assert checkpoints.read_marker(good)["step"] == 20


def test_prune_keeps_the_newest_committed(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        make(tmp_path, step)
    make(tmp_path, 0, commit=False)
    checkpoints.prune(tmp_path, keep=2)
    assert [s for s, _ in checkpoints.committed(tmp_path)] == [3, 4]
    assert not checkpoints.checkpoint_path(tmp_path, 0).exists()


def test_resume_from(tmp_path: Path) -> None:
    assert checkpoints.resolve_resume(tmp_path / "none-yet", None) is None
    good = make(tmp_path, 5)
    torn = make(tmp_path, 6, commit=False)
    assert checkpoints.resolve_resume(tmp_path, str(good)) == good
    assert checkpoints.resolve_resume(tmp_path, str(tmp_path)) == good  # a directory of checkpoints
    with pytest.raises(ConfigError, match="does not exist"):
        checkpoints.resolve_resume(tmp_path, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="not a committed checkpoint"):
        checkpoints.resolve_resume(tmp_path, str(torn))
