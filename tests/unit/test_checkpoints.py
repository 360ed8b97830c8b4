"""Commit markers and manifests: a checkpoint counts once committed, loads only if intact, else the next older."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from entrypoint.errors import ConfigError
from entrypoint.outputs import checkpoints


def make(root: Path, step: int, commit: bool = True, payload: bytes = b"state") -> Path:
    path = checkpoints.checkpoint_path(root, step)
    path.mkdir(parents=True)
    (path / "state.pt").write_bytes(payload)
    if commit:
        checkpoints.commit(path, {"step": step})
    return path


def read(path: Path) -> bytes:
    return (path / "state.pt").read_bytes()


def test_latest_skips_torn_checkpoints(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    make(tmp_path, 10)
    good = make(tmp_path, 20)
    make(tmp_path, 30, commit=False)
    assert checkpoints.latest(tmp_path) == good
    assert "skipping torn checkpoint" in caplog.text
    assert checkpoints.read_marker(good)["step"] == 20


def test_marker_lists_every_file_with_size_and_checksum(tmp_path: Path) -> None:
    path = make(tmp_path, 5, payload=b"12345")
    files = checkpoints.read_marker(path)["files"]
    assert files["state.pt"]["size"] == 5 and len(files["state.pt"]["sha256"]) == 64
    checkpoints.verify(path)


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda p: (p / "state.pt").write_bytes(b"stat"), "truncated"),
    (lambda p: (p / "state.pt").write_bytes(b"STATE"), "checksum"),
    (lambda p: (p / "state.pt").unlink(), "missing"),
])
def test_verify_names_what_is_wrong(tmp_path: Path, damage: Callable[[Path], object], reason: str) -> None:
    path = make(tmp_path, 5)
    damage(path)
    with pytest.raises(checkpoints.CheckpointError, match=reason):
        checkpoints.verify(path)


def test_markers_without_a_manifest_still_load(tmp_path: Path) -> None:
    path = make(tmp_path, 5, commit=False)
    (path / checkpoints.MARKER).write_text(json.dumps({"step": 5}))  # written by an older version
    assert checkpoints.load_newest(tmp_path, None, read) == (path, b"state")


def test_a_bad_newest_checkpoint_falls_back_to_the_next_older(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    good = make(tmp_path, 10, payload=b"good")
    bad = make(tmp_path, 20)
    (bad / "state.pt").write_bytes(b"st")  # truncated after its commit
    assert checkpoints.load_newest(tmp_path, None, read) == (good, b"good")
    assert f"checkpoint {bad} does not load" in caplog.text and "truncated" in caplog.text


def test_a_checkpoint_that_fails_to_load_falls_back_too(tmp_path: Path) -> None:
    good = make(tmp_path, 10, payload=b"good")
    make(tmp_path, 20, payload=b"wrong shapes")

    def load(path: Path) -> bytes:
        if read(path) == b"wrong shapes":
            raise RuntimeError("size mismatch for weight")
        return read(path)

    assert checkpoints.load_newest(tmp_path, None, load) == (good, b"good")


def test_when_no_committed_checkpoint_loads_the_job_fails_naming_the_directory(tmp_path: Path) -> None:
    for step in (1, 2):
        (make(tmp_path, step) / "state.pt").write_bytes(b"")
    with pytest.raises(ConfigError) as info:
        checkpoints.load_newest(tmp_path, None, read)
    assert str(info.value).startswith(f"{tmp_path}: none of the 2 committed checkpoints loads")


def test_resume_from(tmp_path: Path) -> None:
    """While the job has no committed checkpoint of its own, ``--resume-from`` is where it starts (and must load)."""
    job, source = tmp_path / "job", tmp_path / "source"
    assert checkpoints.load_newest(job / "none-yet", None, read) is None
    good = make(source, 5)
    torn = make(source, 6, commit=False)
    assert checkpoints.load_newest(job, str(good), read) == (good, b"state")
    assert checkpoints.load_newest(job, str(source), read) == (good, b"state")  # a directory of them
    with pytest.raises(ConfigError, match="does not exist"):
        checkpoints.load_newest(job, str(tmp_path / "missing"), read)
    with pytest.raises(ConfigError, match="not a committed checkpoint"):
        checkpoints.load_newest(job, str(torn), read)
    (good / "state.pt").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"--resume-from: .* does not load: CheckpointError"):
        checkpoints.load_newest(job, str(good), read)  # an explicit bad checkpoint never falls back


def test_once_the_job_committed_its_own_checkpoints_they_win_over_resume_from(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A warm-started job restarted with the same arguments goes on from its own newest checkpoint (the warm start
    may even be gone by then); when none of its own loads, the warm start is the start again, said in a warning."""
    job, source = tmp_path / "job", tmp_path / "source"
    warm = make(source, 10, payload=b"warm")
    make(job, 20, payload=b"own 20")
    own = make(job, 30, payload=b"own 30")
    caplog.set_level("INFO")
    assert checkpoints.load_newest(job, str(warm), read) == (own, b"own 30")
    assert f"resuming from its newest, {own}, not from --resume-from {warm}" in caplog.text
    assert checkpoints.load_newest(job, str(source / "pruned-since"), read) == (own, b"own 30")
    for step in (20, 30):
        corrupt(checkpoints.checkpoint_path(job, step))
    retention = checkpoints.Retention(1)
    assert checkpoints.load_newest(job, str(warm), read, retention) == (warm, b"warm")
    assert f"none of the job's 2 committed checkpoints in {job} loads: starting again from --resume-from" in caplog.text
    assert set(retention.bad) == {checkpoints.checkpoint_path(job, 20), checkpoints.checkpoint_path(job, 30)}


def steps(root: Path) -> list[int]:
    return [s for s, _ in checkpoints.committed(root, warn=False)]


def test_prune_keeps_the_newest_committed(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        make(tmp_path, step)
    make(tmp_path, 0, commit=False)
    checkpoints.Retention(2).prune(tmp_path)
    assert steps(tmp_path) == [3, 4]
    assert not checkpoints.checkpoint_path(tmp_path, 0).exists()


def corrupt(path: Path) -> None:
    (path / "state.pt").write_bytes(b"garbage of another size")


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_retention_deletes_the_bad_first_and_never_the_newest_that_verifies(
        tmp_path: Path, keep: int, caplog: pytest.LogCaptureFixture) -> None:
    """The two newest of four are corrupt: resume takes 20, a save at 25 must leave 25 (and never only bad ones)."""
    for step in (10, 20, 30, 40):
        make(tmp_path, step)
    corrupt(checkpoints.checkpoint_path(tmp_path, 30))
    corrupt(checkpoints.checkpoint_path(tmp_path, 40))
    retention = checkpoints.Retention(keep)
    restored = checkpoints.load_newest(tmp_path, None, read, retention)
    assert restored is not None and restored[0].name == "ckpt-00000020"
    assert steps(tmp_path) == [10, 20, 30, 40]  # resuming deletes nothing
    retention.verified(make(tmp_path, 25))
    retention.prune(tmp_path)
    assert steps(tmp_path) == {1: [25], 2: [20, 25], 3: [10, 20, 25]}[keep]
    assert "deleting checkpoint" in caplog.text and "ckpt-00000030" in caplog.text  # the bad ones are named
    assert checkpoints.load_newest(tmp_path, None, read)[0].name == "ckpt-00000025"  # type: ignore[index]


def test_retention_keeps_the_restored_checkpoint_until_a_newer_one_verifies(tmp_path: Path) -> None:
    """Saves of other processes' (unknown) checkpoints never push out the only one known to load."""
    make(tmp_path, 10)
    retention = checkpoints.Retention(1)
    checkpoints.load_newest(tmp_path, None, read, retention)
    make(tmp_path, 20)  # committed by someone else: not known to verify
    retention.prune(tmp_path)
    assert steps(tmp_path) == [10]
    retention.verified(make(tmp_path, 30))
    retention.prune(tmp_path)
    assert steps(tmp_path) == [30]


def test_check_sizes_catches_a_file_that_shrank_after_the_commit(tmp_path: Path) -> None:
    path = make(tmp_path, 5, payload=b"12345")
    checkpoints.check_sizes(path)
    (path / "state.pt").write_bytes(b"12")
    with pytest.raises(checkpoints.CheckpointError, match="2 bytes after the commit"):
        checkpoints.check_sizes(path)


def test_a_checkpoint_rewritten_after_a_fallback_is_good_and_kept(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The newest is bad, resume falls back; training commits the same step again (good now): retention keeps it
    and says nothing about it not loading."""
    for step in (30, 40, 44):
        make(tmp_path, step)
    newest = checkpoints.checkpoint_path(tmp_path, 44)
    corrupt(newest)
    retention = checkpoints.Retention(3)
    assert checkpoints.load_newest(tmp_path, None, read, retention) == (checkpoints.checkpoint_path(tmp_path, 40),
                                                                         b"state")
    (newest / "state.pt").write_bytes(b"state")  # the step is trained again and committed
    checkpoints.commit(newest, {"step": 44})
    retention.verified(newest)
    make(tmp_path, 50)
    retention.verified(checkpoints.checkpoint_path(tmp_path, 50))
    caplog.clear()
    retention.prune(tmp_path)
    assert steps(tmp_path) == [40, 44, 50]
    assert "does not load" not in caplog.text
