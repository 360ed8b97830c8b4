"""A checkpoint written again at a step that has one (``checkpoints.write_beside``, the JAX and Keras writers'): the
committed one stays loadable through a failure or a kill mid-write, and is replaced only by a committed one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint.outputs import checkpoints
from tests.conftest import ROOT, subprocess_env


def writer(payload: bytes, fail: bool = False) -> object:
    def write(directory: Path) -> None:
        (directory / "state.bin").write_bytes(payload)
        if fail:
            raise OSError(28, "No space left on device")
        checkpoints.commit(directory, {"step": 3})
    return write


def test_a_rewrite_replaces_the_committed_checkpoint_with_the_new_one_and_leaves_nothing_beside(tmp_path: Path) -> None:
    target = tmp_path / "ckpt-00000003"
    checkpoints.write_beside(target, writer(b"old"))  # type: ignore[arg-type]
    checkpoints.write_beside(target, writer(b"new"))  # type: ignore[arg-type]
    assert (target / "state.bin").read_bytes() == b"new"
    checkpoints.verify(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000003"]


def test_a_rewrite_that_fails_leaves_the_committed_checkpoint_loadable(tmp_path: Path) -> None:
    target = tmp_path / "ckpt-00000003"
    checkpoints.write_beside(target, writer(b"old"))  # type: ignore[arg-type]
    with pytest.raises(OSError, match="No space left"):
        checkpoints.write_beside(target, writer(b"new", fail=True))  # type: ignore[arg-type]
    assert checkpoints.committed(tmp_path) == [(3, target)]
    checkpoints.verify(target)
    assert (target / "state.bin").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000003"]  # the failed copy does not fill the disk


KILLED_MID_WRITE = """
import sys, time
from pathlib import Path
from entrypoint.outputs import checkpoints

def write(directory):
    (directory / "state.bin").write_bytes(b"new, half")
    print("writing", flush=True)
    time.sleep(60)

checkpoints.write_beside(Path(sys.argv[1]), write)
"""


def test_a_process_killed_mid_rewrite_leaves_the_committed_checkpoint_loadable(tmp_path: Path) -> None:
    target = tmp_path / "ckpt-00000003"
    checkpoints.write_beside(target, writer(b"old"))  # type: ignore[arg-type]
    proc = subprocess.Popen([sys.executable, "-c", KILLED_MID_WRITE, str(target)], cwd=ROOT, env=subprocess_env(),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
        os.kill(proc.pid, signal.SIGKILL)  # the platform's kill, mid-write
    finally:
        proc.wait(30)
    assert checkpoints.committed(tmp_path) == [(3, target)]
    checkpoints.verify(target)
    assert (target / "state.bin").read_bytes() == b"old"
    checkpoints.write_beside(target, writer(b"new"))  # type: ignore[arg-type]  # the rerun's: what was left goes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000003"]


def test_without_an_atomic_exchange_the_old_checkpoint_counts_between_the_two_renames(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "ckpt-00000003"
    checkpoints.write_beside(target, writer(b"old"))  # type: ignore[arg-type]
    monkeypatch.setattr(checkpoints, "_exchange", lambda a, b: False)  # a file system without renameat2's exchange
    renames: list[Path] = []
    original = Path.rename

    def rename(self: Path, to: Path) -> Path:  # the process ends after the first rename (the old one moved aside)
        renames.append(self)
        if len(renames) == 2:
            raise KeyboardInterrupt
        return original(self, to)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.write_beside(target, writer(b"new"))  # type: ignore[arg-type]
    monkeypatch.undo()
    replaced = tmp_path / ".replaced-ckpt-00000003"
    assert not target.exists() and checkpoints.committed(tmp_path) == [(3, replaced)]
    checkpoints.verify(replaced)
    checkpoints.write_beside(target, writer(b"new"))  # type: ignore[arg-type]
    assert checkpoints.committed(tmp_path) == [(3, target)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000003"]


def test_a_partial_rewrite_a_kill_left_is_pruned_once_older_than_every_checkpoint_kept(tmp_path: Path) -> None:
    for step in (3, 5):
        checkpoints.write_beside(checkpoints.checkpoint_path(tmp_path, step), writer(b"x"))  # type: ignore[arg-type]
    left = checkpoints.partial_of(checkpoints.checkpoint_path(tmp_path, 3))
    left.mkdir()  # a rewrite of step 3 the platform killed
    newer = checkpoints.partial_of(checkpoints.checkpoint_path(tmp_path, 7))
    newer.mkdir()  # a write in flight
    checkpoints.Retention(2).prune(tmp_path)
    assert left.is_dir()  # step 3 is still kept
    checkpoints.write_beside(checkpoints.checkpoint_path(tmp_path, 6), writer(b"x"))  # type: ignore[arg-type]
    checkpoints.Retention(2).prune(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".partial-ckpt-00000007", "ckpt-00000005", "ckpt-00000006"]
