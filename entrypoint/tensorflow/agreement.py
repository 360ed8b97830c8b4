"""Every worker acts on an event at the same point of the Keras loop, on whichever worker the event was heard.

A SIGTERM reaches one worker (its node is preempted), the platform's advance notice one node's metadata server; yet the
save it leads to, and the validation pass abandoned before it, must happen at the same place on every worker: under
MultiWorkerMirroredStrategy the workers run the same collectives in the same order, and one that a worker skips is
matched with another's (measured: a hang, or a wrong sum without an error). So the loop passes numbered points (every
training batch, every validation batch, every epoch end: ``point``), the same sequence on every worker, each separated
from the one before by a collective (the step's own, or the read of the metrics before an epoch ends), so no worker is
ever more than one point ahead of another.

A worker that heard an event at its point *c* writes "at point *c*+1" under the next free key of a sequence in
TensorFlow's coordination service (on the chief) and waits until every worker's watcher thread has acknowledged it; a
worker behind reaches *c*+1 after learning it, and one ahead is at most inside the collective before *c*+1, which
cannot end before the proposer leaves *c*. So every worker acts at *c*+1. It is the protocol of TensorFlow's
``PreemptionCheckpointHandler``, which agrees only on stopping, and only at training steps; here any event at any point.
Two workers that propose at once: the first key wins, and the second finds its event already covered (one stop, or a
notice's commit that comes after it heard its own). With one worker (no coordination service) an event is acted on at
the point where it is heard. Waiting costs nothing per point: each watcher asks the service once a second.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("entrypoint.tensorflow")
PREFIX = "entrypoint/agreed"  # keys PREFIX/<n> (the n-th agreement) and PREFIX/<n>/ack/<worker>
POLL_MS = 1000  # a watcher's wait for the next key, between checks that it should end
STOP, NOTICE = "stop", "notice"  # the kinds of events


@dataclass(frozen=True)
class Agreed:
    """An event every worker acts on at ``point``: its kind and what it was (``SIGTERM on workerpool1-0``)."""

    point: int
    kind: str
    what: str

    def text(self) -> str:
        return f"{self.point} {self.kind} {self.what}"

    @staticmethod
    def parse(text: str) -> Agreed:
        point, kind, what = text.split(" ", 2)
        return Agreed(int(point), kind, what)


def coordination_service() -> Any:
    """TensorFlow's eager context when this process joined a coordination service (MultiWorkerMirrored), else None."""
    from tensorflow.python.eager import context  # its key-value store has no public API

    ctx = context.context()
    config = ctx.coordination_service
    return ctx if config is not None and config.service_type else None


class Agreement:
    """The points of one worker (``me`` of ``workers``); ``service``: TensorFlow's context with the coordination
    service, None for one worker. ``timeout``: how long a proposer waits for the others' acknowledgements."""

    def __init__(self, workers: int, me: int, timeout: float, service: Any = None) -> None:
        self.workers, self.me, self.timeout_ms = workers, me, max(int(timeout * 1000), 1)
        self.service: Any = service if workers > 1 else None
        self.point_count = 0  # the points passed
        self.agreed: list[Agreed] = []  # in the order of their keys
        self._known = 0  # keys this worker's watcher has read
        self._changed = threading.Condition()
        self._closed = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> Agreement:
        """Watch the service for agreements (nothing to watch with one worker)."""
        if self.service is not None and self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="agreed-points", daemon=True)
            self._watcher.start()
        return self

    def close(self) -> None:
        """Stop watching (at most ``POLL_MS`` later)."""
        self._closed.set()
        with self._changed:
            self._changed.notify_all()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=POLL_MS / 1000 + 5)

    def point(self, heard: Iterable[tuple[str, str]] = ()) -> list[Agreed]:
        """Pass the next point: propose each event this worker heard since its last point (``(kind, what)``); the
        events every worker acts on here, in the order they were agreed."""
        self.point_count += 1
        here = self.point_count
        if self.service is None:  # one worker: at once
            for kind, what in heard:
                if not self._covered(kind, here):
                    self.agreed.append(Agreed(here, kind, what))
            return [a for a in self.agreed if a.point == here]
        with self._changed:
            due = [a for a in self.agreed if a.point == here]
        for kind, what in heard:
            self._propose(Agreed(here + 1, kind, what))
        return due

    def pending(self, kind: str) -> Agreed | None:
        """An agreed event of ``kind`` whose point has not been reached (the loop ended first), if any."""
        with self._changed:
            return next((a for a in self.agreed if a.kind == kind and a.point > self.point_count), None)

    def _covered(self, kind: str, point: int) -> bool:
        """Whether an agreed event acts for one of ``kind`` heard before ``point``: any stop; a notice's commit at
        ``point`` or later (it comes after the hearing)."""
        return any(a.kind == kind and (kind == STOP or a.point >= point) for a in self.agreed)

    def _propose(self, event: Agreed) -> None:
        """Claim the next free key for ``event`` (unless an agreement already covers it), then wait for every
        worker's acknowledgement, so each knows it before it can reach ``event.point``."""
        from tensorflow import errors

        while True:
            with self._changed:
                if self._covered(event.kind, event.point):
                    return
                n = self._known
            try:
                self.service.set_config_key_value(f"{PREFIX}/{n}", event.text())
                break
            except errors.AlreadyExistsError:  # another worker claimed key n first: read it, look again
                with self._changed:
                    while self._known <= n and not self._closed.is_set():
                        self._changed.wait(POLL_MS / 1000)
                if self._closed.is_set():
                    return
        for worker in range(self.workers):
            try:
                self.service.get_config_key_value(f"{PREFIX}/{n}/ack/{worker}", self.timeout_ms)
            except errors.OpError as exc:  # a worker gone: the next collective says so
                log.warning("worker %d did not acknowledge the %s at point %d within --timeout (%s)", worker,
                            event.kind, event.point, type(exc).__name__)
                return

    def _watch(self) -> None:
        """Read the agreements in key order, acknowledging each, until closed (or the service is gone)."""
        from tensorflow import errors

        n = 0
        while not self._closed.is_set():
            try:
                text = self.service.get_config_key_value(f"{PREFIX}/{n}", POLL_MS)
            except errors.DeadlineExceededError:
                continue
            except errors.OpError as exc:  # the chief (the service) is gone: the next collective says so
                log.debug("no more agreements: %s", type(exc).__name__)
                return
            event = Agreed.parse(text)
            with self._changed:
                if event.point <= self.point_count:  # cannot happen while every point is separated by a collective
                    log.error("agreed on %s at point %d, already passed (%d): workers may disagree", event.kind,
                              event.point, self.point_count)
                self.agreed.append(event)
                self._known = n + 1
                self._changed.notify_all()
            try:
                self.service.set_config_key_value(f"{PREFIX}/{n}/ack/{self.me}", "1")
            except errors.OpError as exc:
                log.debug("could not acknowledge agreement %d: %s", n, type(exc).__name__)
                return
            n += 1
