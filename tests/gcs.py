"""A real GCS JSON API server on 127.0.0.1 (gcp-storage-emulator, on disk in a temp dir) for gs:// tests.

The emulator runs with the object preconditions it lacks and Cloud Storage checks (``tests/gcs_server.py``).

gcsfs reaches it through its documented emulator setting, ``STORAGE_EMULATOR_HOST``. The server can be
stopped and started again on the same port with the same data (``stop`` / ``start``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.lifecycle.startup.ports import free_ports

BUCKET = "trainer-test"
SERVER = Path(__file__).with_name("gcs_server.py")


class Emulator:
    """One emulator process serving ``BUCKET``; its data survives a stop and start."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir, self.port = data_dir, free_ports(1)[0]
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a child process needs to write gs:// to this server."""
        return {"STORAGE_EMULATOR_HOST": self.host}

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        env = {**os.environ, "STORAGE_BASE": str(self.data_dir)}
        log = self.data_dir.parent / f"{self.data_dir.name}-emulator.log"
        with log.open("ab") as out:
            # tests/gcs_server.py: the emulator with Cloud Storage's preconditions (ifGenerationMatch)
            self.proc = subprocess.Popen([sys.executable, str(SERVER), "start", "--host", "127.0.0.1",
                                          "--port", str(self.port), "--default-bucket", BUCKET, "--quiet"],
                                         env=env, stdout=out, stderr=out, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            if self.proc.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-1:]
                raise RuntimeError(f"the GCS emulator exited with {self.proc.returncode}: {tail}")
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("the GCS emulator did not start within 30 s")

    def stop(self) -> None:
        """Stop the server as a machine going away would for its clients: connections refused from now on.

        SIGINT, not SIGKILL: the emulator rewrites its whole index file (``.meta``) in place after every
        object, and a SIGKILL in the middle of that write leaves an index it cannot start from again. On
        SIGINT it finishes the request in hand and stops serving; SIGKILL only if it does not within 20 s.
        """
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def fs(self) -> object:
        """A gcsfs file system on this server (for assertions)."""
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(token="anon", endpoint_url=self.host, use_listings_cache=False)


def gs_dir(request: pytest.FixtureRequest) -> str:
    """A prefix of the test's own on the bucket."""
    return f"gs://{BUCKET}/{request.node.name}"


@contextlib.contextmanager
def running(data_dir: Path) -> Iterator[Emulator]:
    """An emulator for the block; always stopped afterwards."""
    emulator = Emulator(data_dir)
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def emulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Emulator]:
    """A GCS server for the test; this process's storage seam pointed at it too (for the assertions).

    Registered for every test by tests/conftest.py (``pytest_plugins``).
    """
    from entrypoint.outputs import storage

    with running(tmp_path / "gcs") as server:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.host)
        monkeypatch.setattr(storage, "_filesystems", {})
        monkeypatch.setattr(storage, "_unreachable", set())
        yield server
