"""The storage seam against a real GCS JSON API server (gcp-storage-emulator): objects, checkpoints, records.

No mock of gcsfs: every call goes over HTTP to the emulator on 127.0.0.1, as gcsfs goes to Cloud Storage.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint import errors, failures
from entrypoint.errors import ConfigError
from entrypoint.failures.records import read_records
from entrypoint.outputs import checkpoints, storage
from entrypoint.outputs.storage import RemotePath, StorageError
from tests.conftest import skip_unless_installed
from tests.gcs import BUCKET, Emulator, running

skip_unless_installed("gcsfs", "gcp_storage_emulator")


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    with running(tmp_path_factory.mktemp("gcs")) as server:
        yield server


@pytest.fixture
def gs(emulator: Emulator, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> RemotePath:
    """A fresh prefix on the emulator, this process's gcsfs pointed at it."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.host)
    monkeypatch.setattr(storage, "_filesystems", {})
    return RemotePath(f"gs://{BUCKET}/{request.node.name}")


def test_urls_are_remote_and_paths_stay_pathlib() -> None:
    assert storage.is_remote("gs://b/x") and storage.is_remote("s3://b/x") and storage.is_remote("memory://x")
    assert not storage.is_remote("/tmp/x") and not storage.is_remote("file:///tmp/x")
    assert storage.path("/tmp/x") == Path("/tmp/x") and storage.path("file:///tmp/x") == Path("/tmp/x")
    remote = storage.path("gs://b/a/ckpt-00000001/")
    assert isinstance(remote, RemotePath) and str(remote) == "gs://b/a/ckpt-00000001"
    assert remote.name == "ckpt-00000001" and str(remote.parent) == "gs://b/a"
    assert str(remote / "x") == str(remote) + "/x"


def test_objects_round_trip(gs: RemotePath) -> None:
    assert not gs.exists() and list(gs.iterdir()) == []
    (gs / "a" / "one.json").write_text("{}")
    (gs / "b.bin").write_bytes(b"x" * 1000)
    with (gs / "c.bin").open("wb") as f:
        f.write(b"y" * 3000)
    assert gs.is_dir() and (gs / "a").is_dir() and (gs / "b.bin").is_file() and not (gs / "a").is_file()
    assert [p.name for p in gs.iterdir()] == ["a", "b.bin", "c.bin"]
    assert [p.name for p in gs.glob("*.bin")] == ["b.bin", "c.bin"]
    assert sorted(storage.relative(p, gs) for p in gs.rglob("*")) == ["a/one.json", "b.bin", "c.bin"]
    assert (gs / "c.bin").stat().st_size == 3000 and (gs / "a" / "one.json").read_text() == "{}"
    (gs / "b.bin").unlink()
    (gs / "b.bin").unlink(missing_ok=True)
    storage.rmtree(gs)
    assert not gs.exists()


def _commit(root: RemotePath, step: int, payload: bytes) -> RemotePath:
    path = checkpoints.checkpoint_path(root, step)
    assert isinstance(path, RemotePath)
    (path / "state.bin").write_bytes(payload)
    checkpoints.commit(path, {"step": step})
    return path


def test_checkpoints_commit_verify_fall_back_and_keep_k_on_gcs(gs: RemotePath) -> None:
    for step in (1, 2, 3):
        _commit(gs, step, bytes([step]) * 4096)
    (checkpoints.checkpoint_path(gs, 0) / "state.bin").write_bytes(b"torn")  # no marker: skipped
    (checkpoints.checkpoint_path(gs, 4) / "state.bin").write_bytes(b"torn")
    assert [s for s, _ in checkpoints.committed(gs)] == [1, 2, 3]
    newest = checkpoints.checkpoint_path(gs, 3)
    (newest / "state.bin").write_bytes(b"\x03" * 100)  # truncated after the commit
    retention = checkpoints.Retention(2)
    found = checkpoints.load_newest(gs, None, lambda p: (p / "state.bin").read_bytes(), retention)
    assert found is not None and found[0] == checkpoints.checkpoint_path(gs, 2) and found[1] == b"\x02" * 4096
    assert retention.bad == {newest: "CheckpointError: state.bin is 100 bytes, the marker says 4096 (truncated?)"}
    _commit(gs, 5, b"\x05" * 10)
    retention.verified(checkpoints.checkpoint_path(gs, 5))
    doomed = retention.prune(gs)
    assert newest in doomed  # the bad one goes first
    assert [s for s, _ in checkpoints.committed(gs)] == [2, 5]
    assert not checkpoints.checkpoint_path(gs, 0).exists()  # torn and older than what is kept
    assert checkpoints.checkpoint_path(gs, 4).exists()  # torn but newer: maybe a save in flight


def test_none_that_loads_is_a_config_error_naming_the_url(gs: RemotePath) -> None:
    path = _commit(gs, 1, b"x" * 10)
    (path / "state.bin").write_bytes(b"y")
    with pytest.raises(ConfigError, match=f"{gs}: none of the 1 committed checkpoints loads"):
        checkpoints.load_newest(str(gs), None, lambda p: None)


def test_pytorch_writers_save_load_and_export_to_gcs(gs: RemotePath) -> None:
    torch = pytest.importorskip("torch")
    from entrypoint.pytorch.checkpoints import checkpoint_io
    from entrypoint.pytorch.loop import export

    model = torch.nn.Linear(4, 3)
    for mode in ("sync", "async"):
        io = checkpoint_io.make_io(mode, keep=1)
        for step in (10, 20):
            io.save(checkpoints.checkpoint_path(gs / mode, step), {"model": model.state_dict(), "step": step},
                    {"step": step})
        io.wait()
        ((_step, path),) = checkpoints.committed(gs / mode)
        checkpoints.verify(path)
        loaded = io.load(path, torch.device("cpu"))
        assert loaded["step"] == 20 and torch.equal(loaded["model"]["weight"], model.weight)
    export.export_model(model, gs / "model", None, None)
    assert sorted(p.name for p in (gs / "model").iterdir()) == ["model.pt", "model.safetensors", "state_dict.pt"]

    def custom(module: object, directory: Path, ctx: object) -> None:  # a user's hook: torch.save on paths
        torch.save(model.state_dict(), directory / "weights.pt")
        (directory / "assets").mkdir()
        (directory / "assets" / "vocab.txt").write_text("a\nb\n")

    export.export_model(model, gs / "custom", custom, None)
    assert (gs / "custom" / "assets" / "vocab.txt").read_text() == "a\nb\n" and (gs / "custom" / "weights.pt").is_file()


def test_failure_records_and_summary_go_to_gcs(gs: RemotePath) -> None:
    from entrypoint.outputs.summary import TrainingSummary, write_summary

    ctx = failures.FailureContext(replica="workerpool0-0", rank=0, job_dir=str(gs), secrets=frozenset({"hunter2"}))
    failures.write_record(ctx, failures.Failure(errors.USER_CODE, "boom hunter2"))
    (written,) = (gs / "failures").glob("*.json")
    assert isinstance(written, RemotePath) and str(written.parent) == f"{gs}/failures"
    (record,) = read_records(str(gs), since=ctx.started)
    assert record.message == "boom ***" and record.replica == "workerpool0-0"
    summary = TrainingSummary("pytorch", "ddp", "gloo", "cpu", 2, 2, 64, 1, 0, 0, 10, 10, [10, 10],
                              {"loss": float("nan")}, {}, 1.0, 1.0, 0.0, 0.0, None, None, "x")
    path = write_summary(gs / "model", summary)
    assert json.loads(path.read_text())["metrics"] == {"loss": None}


def test_an_unreachable_store_is_retryable_and_credentials_name_the_bucket() -> None:
    import aiohttp
    from gcsfs.retry import HttpError
    from google.auth.exceptions import DefaultCredentialsError, RefreshError

    key = aiohttp.client_reqrep.ConnectionKey("127.0.0.1", 9, False, True, None, None, None)
    refused = aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "Connect call failed"))
    down = failures.classify(StorageError("gs://bkt/job/checkpoints/ckpt-00000010/state.pt", refused))
    assert down.cls == errors.STORAGE_UNAVAILABLE and down.exit_code == 197 and errors.is_retryable(197)
    assert "gs://bkt unreachable" in down.message
    missing = failures.classify(StorageError("gs://bkt/job/model", DefaultCredentialsError("secret-path")))
    assert missing.exit_code == 73 and missing.message.startswith("gs://bkt: no Application Default Credentials")
    assert "GOOGLE_APPLICATION_CREDENTIALS" in missing.message and "secret-path" not in missing.message
    malformed = DefaultCredentialsError("File /k.json is not a valid json file.", ValueError("Expecting value"))
    malformed.__cause__ = ValueError("Expecting value")
    for error in (StorageError("gs://bkt/job", malformed), StorageError("gs://bkt/job", malformed, True),
                  StorageError("gs://bkt/job", DefaultCredentialsError("File /k.json was not found."), True)):
        unusable = failures.classify(error)  # found but unusable: google-auth's reason, not "none found"
        assert unusable.exit_code == 73 and "cannot be used (google-auth: File /k.json " in unusable.message
        assert "no Application Default Credentials found" not in unusable.message
    expired = failures.classify(StorageError("gs://bkt/x", RefreshError("token ya29.SECRET")))
    assert expired.exit_code == 73 and "ya29" not in expired.message
    denied = failures.classify(StorageError("gs://bkt/x", HttpError({"code": 403, "message": "denied"})))
    assert denied.exit_code == 73 and "access denied" in denied.message and "gs://bkt" in denied.message
    assert failures.code_class(197) == errors.STORAGE_UNAVAILABLE


def test_a_library_writing_the_store_itself_fails_as_the_store_not_as_the_users_code(tmp_path: Path) -> None:
    """TensorBoard's event writer talks to gs:// through gcsfs itself: its refused connection (raised at a flush
    or the close, in the loop) is the store's, retryable; on a disk an OSError keeps its own class."""
    refused = ConnectionRefusedError(111, "Connect call failed")
    with pytest.raises(StorageError) as raised, storage.store_errors("gs://bkt/job/logs"):
        raise refused
    assert raised.value.cause is refused and failures.classify(raised.value).exit_code == 197
    with pytest.raises(ConnectionRefusedError), storage.store_errors(tmp_path / "logs"):
        raise refused


def test_staging_uploads_a_committed_checkpoint_marker_last_and_mirrors_directories(
        gs: RemotePath, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from entrypoint.outputs.locations import resolve_outputs
    from entrypoint.outputs.staging import Staging

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    outputs = resolve_outputs(job_dir=str(gs), model_dir=None, checkpoint_dir=None,
                              tensorboard_dir=str(tmp_path / "logs"), trial=None)
    with Staging(outputs) as staging:
        assert staging.staged("checkpoints") and not staging.staged("tensorboard")
        assert staging.local("tensorboard") == tmp_path / "logs"  # a local output is written where it is
        local = staging.local("checkpoints")
        assert local.parent == staging.root and staging.root.parent == tmp_path
        assert staging.root.stat().st_mode & 0o777 == 0o700  # private to this process
        written: list[str] = []
        original = storage.upload_tree

        def recorded(source: Path, target: RemotePath, last: tuple[str, ...] = ()) -> list[str]:
            names = original(source, target, last)
            written.extend(names)
            return names

        monkeypatch.setattr(storage, "upload_tree", recorded)
        ckpt = local / "ckpt-00000007"
        (ckpt / "sub").mkdir(parents=True)
        (ckpt / "weights.data").write_bytes(b"w" * 5000)
        (ckpt / "sub" / "z").write_text("z")
        checkpoints.commit(ckpt, {"step": 7})
        remote = staging.push_checkpoint(ckpt)
        assert written[-1] == checkpoints.MARKER and sorted(written[:-1]) == ["sub/z", "weights.data"]
        assert not ckpt.exists() and str(remote) == f"{gs}/checkpoints/ckpt-00000007"
        assert [step for step, _ in checkpoints.committed(staging.target("checkpoints"))] == [7]
        checkpoints.verify(remote)
        copy = staging.pull_checkpoint(remote)
        assert (copy / "weights.data").read_bytes() == b"w" * 5000 and (copy / checkpoints.MARKER).is_file()
        assert staging.pull_checkpoint(tmp_path) == tmp_path  # a local checkpoint is loaded where it is

        model = staging.local("model")
        (model / "variables").mkdir()
        (model / "variables" / "v").write_text("v")
        (model / "saved_model.pb").write_text("pb")
        written.clear()
        staging.publish("model", last=("saved_model.pb",))
        assert written == ["variables/v", "saved_model.pb"]

        backup, mirror = staging.root / "backup", staging.target("checkpoints") / "backup"
        backup.mkdir()
        for name in ("ckpt-1.index", "checkpoint"):
            (backup / name).write_text(name)
        staging.push(backup, mirror, last=("checkpoint",), prune=True)
        (backup / "ckpt-1.index").unlink()
        (backup / "ckpt-2.index").write_text("new")
        staging.push(backup, mirror, last=("checkpoint",), prune=True)
        assert sorted(p.name for p in mirror.iterdir()) == ["checkpoint", "ckpt-2.index"]  # the stale one went
        restored = tmp_path / "restored"
        assert sorted(staging.pull(mirror, restored)) == ["checkpoint", "ckpt-2.index"]
        staging.discard(mirror)
        assert not mirror.exists() and staging.pull(mirror, tmp_path / "none") == []
        root = staging.root
    assert not root.exists()  # removed at exit
