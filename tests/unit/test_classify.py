"""``failures.classify``: exceptions to failure classes and exit codes (no framework needed)."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from entrypoint import failures
from entrypoint.errors import ConfigError, NonFiniteLoss, PeerError
from entrypoint.outputs.locations import ensure_writable, missing_fuse_mount


@pytest.mark.parametrize(("exc", "outputs", "cls", "code"), [
    (PermissionError(errno.EACCES, "Permission denied", "/out/a"), ["/out/a/b"], "output_not_writable", 73),
    (PermissionError(errno.EACCES, "Permission denied", "/out/a/b/model/x.pt"), ["/out/a/b"], "output_not_writable",
     73),
    (PermissionError(errno.EACCES, "Permission denied", "/etc/shadow"), ["/out/a/b"], "user_code", 1),
    (OSError(errno.ENOSPC, "No space left on device", "/out/x"), [], "disk_full", 74),
    (OSError(errno.EROFS, "Read-only file system", "/out/x"), [], "output_not_writable", 73),
    (ConfigError("CLUSTER_SPEC", "missing", "task"), [], "config", 2),
    (PeerError("gone"), [], "peer_lost", 129),
    (RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:4242"), [], "user_code", 1),  # raised nowhere known
    (NonFiniteLoss("nan at step 5"), [], "nonfinite_loss", 65),
    (ValueError("bad"), [], "user_code", 1),
    (KeyboardInterrupt(), [], "signal", 130),
])
def test_classify_table(exc: BaseException, outputs: list[str], cls: str, code: int) -> None:
    failure = failures.classify(exc, outputs)
    assert (failure.cls.name, failure.exit_code) == (cls, code)


def _as_nobody(target: Path) -> str:
    """``ensure_writable([target])`` in a forked child running as uid 65534; the message it failed with."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root, try, report, leave without running pytest's teardown
        os.close(read)
        message = "no failure"
        try:
            os.setgid(65534)
            os.setuid(65534)
            ensure_writable([target])
        except BaseException as exc:
            failure = failures.classify(exc)
            message = f"{failure.exit_code} {failure.message}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        return f.read()


def test_a_directory_this_user_cannot_create_is_an_output_failure_naming_it() -> None:
    """As the image's non-root user on a root-owned volume: 73 and one line naming the directory and the uid."""
    base = Path(tempfile.mkdtemp(prefix="trainer-perm-"))
    try:
        base.chmod(0o755)
        (base / "out").mkdir(mode=0o755)  # root's, like a volume mounted into the container
        target = base / "out" / "a" / "b"
        if os.geteuid() != 0:
            (base / "out").chmod(0o555)
            message = ""
            try:
                ensure_writable([target])
            except BaseException as exc:
                failure = failures.classify(exc)
                message = f"{failure.exit_code} {failure.message}"
        else:
            message = _as_nobody(target)
        uid = os.getuid() if os.geteuid() != 0 else 65534
        assert message.startswith("73 ") and str(target) in message, message
        assert f"uid {uid}" in message and f"{base / 'out'} belongs to uid" in message
        assert not (base / "out" / "a").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_gcs_paths_without_the_fuse_mount_are_refused_and_never_created() -> None:
    if os.path.ismount("/gcs"):
        pytest.skip("this machine has a /gcs mount")
    assert missing_fuse_mount("/gcs/bucket-canary/model") == "gs://bucket-canary"
    assert missing_fuse_mount("/tmp/gcs/bucket/model") is None
    with pytest.raises(Exception) as info:  # a /gcs path given as such (gs:// URLs go through gcsfs instead)
        ensure_writable(["/gcs/bucket-canary/model"])
    failure = failures.classify(info.value)
    assert failure.exit_code == 73 and "no Cloud Storage FUSE mount at /gcs for gs://bucket-canary" in failure.message
    assert not Path("/gcs/bucket-canary").exists()
