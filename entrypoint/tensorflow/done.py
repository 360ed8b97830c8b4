"""How replicas that do not train (ps, PS workers, evaluators) learn that training is over.

The chief writes ``<checkpoint_dir>/TRAINING_DONE`` (a fresh id each run) after its last commit and
the export. A watcher takes the marker it finds at start for a previous run's when it was written before its own
process started, and sees the job done once the marker holds a different id; a marker written since (a replica
restarted in place while the chief finished) is this run's. As a fallback they probe the chief's address: once seen
listening, a chief silent for longer than ``--timeout`` means it is gone (retryable, no hang).
A failing chief writes nothing, so a restarted chief finds its servers still serving.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path

from entrypoint.errors import PeerError
from entrypoint.lifecycle.jobdir.lease import start_ticks
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


def _finished_at(marker: str) -> float:
    """When the marker's run finished (0.0 for a marker that does not say: taken for an old one)."""
    try:
        return float(json.loads(marker)["finished_at"])
    except (ValueError, KeyError, TypeError):
        return 0.0


def process_started() -> float:
    """When this process started (wall clock, from /proc); now where /proc cannot tell. A restarted replica's
    watcher is made after its imports: a marker the chief wrote meanwhile is this run's, not a previous one's."""
    ticks = start_ticks(os.getpid())  # since boot
    try:
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()
    return boot + ticks / os.sysconf("SC_CLK_TCK") if ticks else time.time()


def _listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2.0):
            return True
    except (OSError, ValueError):
        return False


class DoneWatcher:
    """Polls for the chief's done marker; raises PeerError once the chief has been gone too long."""

    def __init__(self, checkpoint_dir: str | Location, chief_address: str | None, timeout: float,
                 started: float | None = None) -> None:
        self.path = marker_path(checkpoint_dir)
        found = _read(self.path)
        since = process_started() if started is None else started
        self.stale = found if found is not None and _finished_at(found) < since else None
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
