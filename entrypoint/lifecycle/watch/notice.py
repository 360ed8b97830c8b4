"""The platform's advance notice: GCE's metadata server says that a VM is about to stop, before the SIGTERM comes.

GCE sets ``instance/preempted`` to ``TRUE`` when it reclaims a Spot (preemptible) VM, and
``instance/maintenance-event`` to the coming event (``TERMINATE_ON_HOST_MAINTENANCE``, ...; ``NONE`` otherwise)
before host maintenance, which a VM with GPUs cannot live-migrate through. A large checkpoint may take longer
than the grace period the signal leaves, so the loop commits one as soon as it hears of the notice.

``NoticeWatcher`` asks this node's metadata server (``settings.metadata_host``: ``GCE_METADATA_HOST``, as
Google's libraries honour it, else ``metadata.google.internal``) from daemon threads, off the training's path:
one probe bounded by ``PROBE_TIMEOUT`` (no server: no watcher and no log line), then a hanging GET per path
(``?wait_for_change=true&last_etag=...``). A request carries ``Metadata-Flavor: Google`` and a response counts
only when it carries the same header (what GCE's server does; a proxy or a captive portal answering instead is
ignored). Each notice is handed out once (``take``); the same path saying something new is a new notice.

``save_seconds`` and ``grace_warning``: how long a committed checkpoint took to save (from its marker), and the
warning when that exceeds ``--grace-period`` (a save at the signal would be cut short).
"""

from __future__ import annotations

import functools
import http.client
import logging
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlencode

from entrypoint.outputs import checkpoints
from entrypoint.outputs.storage import Location
from entrypoint.periodic import Periodic

log = logging.getLogger("entrypoint")
PREEMPTED = "instance/preempted"
MAINTENANCE = "instance/maintenance-event"
ROOT = "/computeMetadata/v1/"
FLAVOR = ("Metadata-Flavor", "Google")  # required on every request; GCE's server sends it on every response
PROBE_TIMEOUT = 1.0  # seconds for the first request: no metadata server answers it, nothing is watched
WAIT_SECONDS = 60  # a hanging GET returns after at most this (``timeout_sec``), then asks again
RETRY_SECONDS = 5.0  # after a failed request (the server restarting, a network blip)
MIN_INTERVAL = 1.0  # between requests that changed nothing (a server that does not hang must not spin us)
_MAX_BODY = 4096


@dataclass(frozen=True)
class Notice:
    """What the platform said: ``preempted``, or the coming maintenance event; and the metadata path that said it."""

    what: str
    source: str

    def __str__(self) -> str:
        return f"{self.what} ({self.source})"


def notice_of(path: str, value: str) -> Notice | None:
    """The notice a path's value gives (None: nothing is coming)."""
    value = value.strip()
    if path == PREEMPTED:
        return Notice("preempted", path) if value.upper() == "TRUE" else None
    return None if value.upper() in ("", "NONE") else Notice(value[:100], path)


class MetadataError(Exception):
    """An answer that is not the metadata server's (no ``Metadata-Flavor: Google``), or not a success."""


def get(host: str, path: str, timeout: float, etag: str | None = None,
        wait: int | None = None) -> tuple[str, str | None]:
    """One GET of ``path`` (a hanging one with ``wait`` seconds): its value and ETag. Never through a proxy."""
    query = {"wait_for_change": "true", "timeout_sec": str(wait)} if wait else {}
    if wait and etag:
        query["last_etag"] = etag
    target = ROOT + path + (f"?{urlencode(query)}" if query else "")
    conn = http.client.HTTPConnection(host, timeout=timeout)  # host[:port]
    try:
        conn.request("GET", target, headers=dict([FLAVOR]))
        response = conn.getresponse()
        body = response.read(_MAX_BODY)
        if response.getheader(FLAVOR[0]) != FLAVOR[1]:
            raise MetadataError(f"{path}: an answer without {FLAVOR[0]}: {FLAVOR[1]} (not a metadata server)")
        if response.status != 200:
            raise MetadataError(f"{path}: HTTP {response.status}")
        return body.decode(errors="replace"), response.getheader("ETag")
    finally:
        conn.close()


class NoticeWatcher:
    """Watches ``instance/preempted`` and ``instance/maintenance-event`` in daemon threads; ``take`` hands out
    each notice once. ``host`` None: nothing is watched."""

    def __init__(self, host: str | None, probe_timeout: float = PROBE_TIMEOUT, wait_seconds: int = WAIT_SECONDS,
                 retry_seconds: float = RETRY_SECONDS) -> None:
        self.host, self.probe_timeout = host, probe_timeout
        self.wait_seconds, self.retry_seconds = wait_seconds, retry_seconds
        self.watching = False  # the probe found a metadata server
        self._lock = threading.Lock()
        self._queue: list[Notice] = []
        self._last: dict[str, Notice | None] = {}
        self._seen: dict[str, tuple[str | None, str | None]] = {}  # each path's last value and ETag
        self._pause = {PREEMPTED: 0.0, MAINTENANCE: 0.0}  # each path's wait before its next request
        self.probed = threading.Event()  # the probe has answered (or failed): tests wait for it
        # a hanging GET in flight ends with its process (the threads are daemons): a stop does not wait for it
        self._watches = {path: Periodic(name, functools.partial(self._look, path),
                                        functools.partial(self._pause.get, path), initial=0.0, join=0.0)
                         for path, name in ((PREEMPTED, "platform-notice"),
                                            (MAINTENANCE, "platform-notice-maintenance"))}

    def start(self) -> NoticeWatcher:
        """Probe and watch in the background; returns at once."""
        if self.host:
            self._watches[PREEMPTED].start()  # the probe first, then the watch of its path
        else:
            self.probed.set()
        return self

    def stop(self) -> None:
        """Stop watching (a hanging GET in flight ends with its process: the threads are daemons)."""
        for watch in self._watches.values():
            watch.stop()

    def take(self) -> Notice | None:
        """The oldest notice not handed out yet (None: none)."""
        if not self._queue:  # cheap enough for every training step
            return None
        with self._lock:
            return self._queue.pop(0) if self._queue else None

    def _probe(self) -> bool:
        """Whether a metadata server answers (then the maintenance watch starts and the first value is delivered)."""
        assert self.host is not None
        try:
            value, etag = get(self.host, PREEMPTED, self.probe_timeout)
        except (OSError, MetadataError, http.client.HTTPException, ValueError) as exc:
            log.debug("no metadata server at %s (%s): the platform's advance notice is not watched", self.host,
                      type(exc).__name__)
            return False
        finally:
            self.probed.set()
        self.watching = True
        log.debug("watching the metadata server at %s for the platform's advance notice", self.host)
        self._watches[MAINTENANCE].start()
        self._seen[PREEMPTED] = (value, etag)
        self._deliver(PREEMPTED, value)
        return True

    def _look(self, path: str) -> bool:
        """One request for ``path``'s value (a hanging GET for a change once it has an ETag); a new one is
        delivered. False: no metadata server (the probe failed), nothing to watch."""
        assert self.host is not None
        if path == PREEMPTED and not self.probed.is_set():
            return self._probe()
        value, etag = self._seen.get(path, (None, None))
        started = time.monotonic()
        try:  # the value now, then a hanging GET for each change (it waits even when there is no ETag yet)
            wait = self.wait_seconds if etag else None
            new, etag = get(self.host, path, (wait or self.probe_timeout) + 10.0, etag, wait)
        except (OSError, MetadataError, http.client.HTTPException, ValueError) as exc:
            log.debug("metadata server: %s: %s", path, exc)
            self._pause[path] = self.retry_seconds
            return True
        self._pause[path] = MIN_INTERVAL if new == value and time.monotonic() - started < MIN_INTERVAL else 0.0
        self._seen[path] = (new, etag)
        self._deliver(path, new)
        return True

    def _deliver(self, path: str, value: str) -> None:
        notice = notice_of(path, value)
        with self._lock:
            if notice is not None and notice != self._last.get(path):
                self._queue.append(notice)
            self._last[path] = notice


def save_seconds(path: Location) -> float | None:
    """How long the committed checkpoint at ``path`` took to save: from the step reached (the save asked for)
    to its marker written (None: not known, e.g. a checkpoint from a version that did not record it)."""
    try:
        marker = checkpoints.read_marker(path)
    except (OSError, ValueError):
        return None
    reached, committed = marker.get("reached_at"), marker.get("committed_at")
    if not isinstance(reached, (int, float)) or not isinstance(committed, (int, float)):
        return None
    return max(float(committed) - float(reached), 0.0)


def grace_warning(name: str, seconds: float, grace: float) -> str | None:
    """The warning for a checkpoint that took ``seconds`` to save, when that exceeds ``--grace-period``."""
    if seconds <= grace:
        return None
    took = f"{seconds:.1f}" if seconds >= 1 else f"{seconds:.3f}"
    return (f"the last checkpoint ({name}) took {took} s to save, longer than --grace-period {grace:g} s: a "
            "save at a preemption's signal may be cut short, and the restart then resumes from the checkpoint before "
            "it; where the platform gives an advance notice (GCE's metadata server) a checkpoint is committed at "
            "once on it; else raise --grace-period (and the platform's own grace to match) or checkpoint more often "
            "(--checkpoint-every)")
