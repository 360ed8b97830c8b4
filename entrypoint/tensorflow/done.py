"""How replicas that do not train (ps, PS workers, evaluators) learn that training is over.

The chief writes ``<checkpoint_dir>/TRAINING_DONE`` (a fresh id each run) after its last commit and
the export. Watchers remember the marker they found at start (a previous run's) and see the job
done once the marker holds a different id. As a fallback they probe the chief's address: once seen
listening, a chief silent for longer than ``--timeout`` means it is gone (retryable, no hang).
A failing chief writes nothing, so a restarted chief finds its servers still serving.
"""

from __future__ import annotations

import json
import socket
import time
import uuid

from entrypoint.errors import PeerError
from entrypoint.outputs import storage
from entrypoint.outputs.storage import Location

MARKER = "TRAINING_DONE"


def marker_path(checkpoint_dir: str | Location) -> Location:
    """Where the chief announces the end of training (shared storage, like the checkpoints; a gs:// one is read
    and written through the storage seam)."""
    return storage.path(checkpoint_dir) / MARKER


def announce_done(checkpoint_dir: str | Location) -> None:
    """Chief only: training and export succeeded; servers and evaluators may stop."""
    storage.path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    marker_path(checkpoint_dir).write_text(json.dumps({"run": uuid.uuid4().hex, "finished_at": time.time()}))


def clear_done(checkpoint_dir: str | Location) -> None:
    """Chief only, at start: drop a previous run's marker (watchers ignore it anyway)."""
    marker_path(checkpoint_dir).unlink(missing_ok=True)


def _read(path: Location) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2.0):
            return True
    except (OSError, ValueError):
        return False


class DoneWatcher:
    """Polls for the chief's done marker; raises PeerError once the chief has been gone too long."""

    def __init__(self, checkpoint_dir: str | Location, chief_address: str | None, timeout: float) -> None:
        self.path = marker_path(checkpoint_dir)
        self.stale = _read(self.path)
        self.chief_address, self.timeout = chief_address, timeout
        self._chief_seen = False
        self._silent_since: float | None = None

    def done(self) -> bool:
        """True once the chief wrote a marker in this run."""
        content = _read(self.path)
        return content is not None and content != self.stale

    def check_chief(self) -> None:
        """Raise PeerError when the chief, once listening, has been unreachable for ``timeout`` seconds."""
        if self.chief_address is None:
            return
        if _listening(self.chief_address):
            self._chief_seen, self._silent_since = True, None
            return
        if not self._chief_seen:
            return
        now = time.monotonic()
        self._silent_since = self._silent_since or now
        if now - self._silent_since > self.timeout:
            raise PeerError(f"the chief at {self.chief_address} is gone and never announced the end of training")

    def wait(self, poll: float = 1.0) -> None:
        """Block until training is done (or the chief is gone: PeerError)."""
        while not self.done():
            self.check_chief()
            time.sleep(poll)
