"""Fast checks of the TensorFlow launcher's plumbing: no TensorFlow import, so they run in every venv."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from unittest import mock

import pytest

from entrypoint.cluster.environments import read_settings, resolve
from entrypoint.errors import ExitCode, PeerError
from entrypoint.failures import classify
from entrypoint.options import RunOptions
from entrypoint.planning.plan import Plan, make_plan
from entrypoint.planning.usercode import UserCode, run_script
from entrypoint.tensorflow import done as done_module
from entrypoint.tensorflow.done import DoneWatcher, announce_done, clear_done
from entrypoint.tensorflow.export import save_on_every_worker


def plan_for(env: dict[str, str], strategy: str | None = None) -> Plan:
    return make_plan(resolve(env), RunOptions(framework="tensorflow", strategy=strategy), read_settings(), 0)


def test_user_tf_config_with_master_is_exported_with_chief_and_legacy_keras() -> None:
    user = {"TF_CONFIG": json.dumps({"cluster": {"master": ["m:1"], "worker": ["w:1"]},
                                     "task": {"type": "master", "index": 0}})}
    env = plan_for(user).emitted_env()
    exported = json.loads(env["TF_CONFIG"])
    assert exported["cluster"] == {"chief": ["m:1"], "worker": ["w:1"]}
    assert exported["task"]["type"] == "chief"
    assert env["TF_USE_LEGACY_KERAS"] == "1" and env["TF_CPP_MIN_LOG_LEVEL"] == "1"


def test_the_users_own_tf_settings_win() -> None:
    with mock.patch.dict(os.environ, {"TF_USE_LEGACY_KERAS": "0", "TF_CPP_MIN_LOG_LEVEL": "0"}):
        env = plan_for({}).emitted_env()
    assert env["TF_USE_LEGACY_KERAS"] == "0" and env["TF_CPP_MIN_LOG_LEVEL"] == "0"


def test_peer_failures_are_retryable_and_others_are_not() -> None:
    def tf_error(name: str) -> Exception:
        cls = type(name, (Exception,), {"__module__": "tensorflow.python.framework.errors_impl"})
        return cls()

    def code(exc: Exception) -> int:
        return classify(exc).exit_code

    assert code(tf_error("DeadlineExceededError")) == code(tf_error("UnavailableError")) == ExitCode.PEER_LOST
    assert code(tf_error("InvalidArgumentError")) == code(ValueError()) == ExitCode.USER_CODE


def test_done_marker_of_a_previous_run_is_ignored(tmp_path: Path) -> None:
    announce_done(tmp_path)  # a previous run finished before this replica's process started
    watcher = DoneWatcher(tmp_path, None, timeout=1, started=time.time() + 1)
    assert not watcher.done()
    clear_done(tmp_path)
    assert not watcher.done()
    announce_done(tmp_path)
    assert watcher.done()


def test_a_marker_written_after_the_process_started_is_this_runs(tmp_path: Path) -> None:
    """A replica restarted in place while the chief finishes: the chief's marker appears between the process's start
    and its watcher (made after TensorFlow's import): it is this run's end, not a previous run's."""
    started = time.time()
    announce_done(tmp_path)
    assert DoneWatcher(tmp_path, None, timeout=1, started=started).done()
    assert DoneWatcher(tmp_path, None, timeout=1).done()  # this process started before the marker was written
    (tmp_path / "TRAINING_DONE").write_text("not json")  # a marker that does not say when: an old one
    assert not DoneWatcher(tmp_path, None, timeout=1).done()


def test_the_process_start_time_is_read_from_proc() -> None:
    assert 0 < done_module.process_started() <= time.time()


def test_a_chief_gone_silent_is_a_retryable_error(tmp_path: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    watcher = DoneWatcher(tmp_path, f"127.0.0.1:{listener.getsockname()[1]}", timeout=0.0)
    watcher.check_chief()  # seen listening
    listener.close()
    watcher.check_chief()  # silent from now on
    with pytest.raises(PeerError) as info:
        watcher.check_chief()
    assert info.value.exit_code == ExitCode.PEER_LOST


def test_unseen_chief_never_times_out(tmp_path: Path) -> None:
    """A chief not listening yet (still starting) is not gone, however long that takes; once it was seen, its
    silence counts (the same watcher raises then: it is not one that never does)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{listener.getsockname()[1]}"  # bound, not listening: nothing answers there yet
    watcher = DoneWatcher(tmp_path, address, timeout=0.0)
    for _ in range(3):
        watcher.check_chief()
    listener.listen()
    watcher.check_chief()  # seen
    listener.close()
    watcher.check_chief()  # silent from now on
    with pytest.raises(PeerError):
        watcher.check_chief()


def test_non_chief_saves_leave_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    written: list[Path] = []

    def save(target: Path) -> None:
        target.mkdir(parents=True)
        (target / "saved_model.pb").write_text("x")
        written.append(target)

    save_on_every_worker(save, tmp_path / "model", is_chief=False)
    assert written and not written[0].exists() and list(scratch.iterdir()) == []
    assert not (tmp_path / "model").exists()
    save_on_every_worker(save, tmp_path / "model", is_chief=True)
    assert (tmp_path / "model" / "saved_model.pb").is_file()


@pytest.mark.parametrize(("body", "code"), [
    ("pass", 0), ("import sys; sys.exit(3)", 3), ("import sys; sys.exit('bad input')", 1), ("raise SystemExit", 0),
])
def test_script_exit_codes(tmp_path: Path, body: str, code: int) -> None:
    script = tmp_path / "task.py"
    script.write_text(f"import sys, pathlib\npathlib.Path(sys.argv[2]).write_text(repr(sys.argv[1:]))\n{body}\n")
    seen = tmp_path / "argv.txt"
    assert run_script(UserCode("script", str(script)), ["--out", str(seen)]) == code
    assert seen.read_text() == repr(["--out", str(seen)])
