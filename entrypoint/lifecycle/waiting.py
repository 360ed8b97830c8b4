"""One way to wait for a peer: bounded by a deadline, saying whom it waits for, failing in one format.

Every bounded wait of the entrypoint's own for another process (the start-up barrier, the chief's store, servers
that must listen, PyTorch's exit barrier, a group re-forming, the ranks still building, the chief's restart) is a
``Wait`` (TensorFlow's exit barrier is its coordination service's, bounded by that service; a parameter server
waiting for the end of training waits as long as training lasts, watching the chief):

- while it waits, it logs ``waiting for <whom>[: <why>]; N s left of --timeout T`` when whom or why changes and
  every ``LOG_EVERY`` seconds;
- at the deadline its error reads ``gave up after T s (--timeout) waiting for <whom>[: <why>]`` (a ``PeerError``,
  retryable, unless the caller names another error type).

A call that may block on its own (a client's handshake with a port that accepts but never answers) runs
through ``bounded``, which gives up at the deadline too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar, cast

from entrypoint.errors import PeerError, TrainerError

log = logging.getLogger("entrypoint")
LOG_EVERY = 20.0  # seconds between two "waiting for" lines that say the same
POLL = 0.05  # seconds between two looks at what a wait waits for
T = TypeVar("T")


class Wait:
    """A wait bounded by ``timeout`` seconds (``flag`` names the option that set it), plus ``margin``.

    ``context`` prefixes its lines (``re-forming the group``); ``first_after`` holds back the first line (a
    wait that usually ends within moments names only whom it really waits for).
    """

    def __init__(self, timeout: float, flag: str = "--timeout", *, margin: float = 0.0, context: str = "",
                 first_after: float = 0.0, logger: logging.Logger | None = None) -> None:
        self.timeout, self.flag, self.context = timeout, flag, context
        self.started = time.monotonic()
        self.deadline = self.started + timeout + margin
        self._said: tuple[str, str] | None = None
        self._next = self.started + first_after
        self._log = logger or log

    @property
    def left(self) -> float:
        """Seconds until the deadline (0 once it passed)."""
        return max(self.deadline - time.monotonic(), 0.0)

    @property
    def expired(self) -> bool:
        """Whether the deadline passed."""
        return time.monotonic() >= self.deadline

    def say(self, whom: str, why: str = "") -> None:
        """Log whom it waits for (and why), when that changed or ``LOG_EVERY`` seconds after the last line."""
        now = time.monotonic()
        if now < self._next and (self._said is None or self._said == (whom, why)):
            return
        self._said, self._next = (whom, why), now + LOG_EVERY
        prefix = f"{self.context}: " if self.context else ""
        self._log.info("%swaiting for %s; %.0f s left of %s %g", prefix, _whom(whom, why), self.left, self.flag,
                       self.timeout)

    def timed_out(self, whom: str, why: str = "") -> str:
        """The one-line message of this wait's timeout."""
        return f"gave up after {self.timeout:g} s ({self.flag}) waiting for {_whom(whom, why)}"

    def error(self, whom: str, why: str = "", kind: type[TrainerError] = PeerError) -> TrainerError:
        """The error to raise at the deadline (a lost peer unless ``kind`` says otherwise)."""
        return kind(self.timed_out(whom, why))

    def sleep(self, most: float = 1.0) -> None:
        """Sleep ``most`` seconds, or until the deadline when that comes first."""
        time.sleep(min(most, self.left))

    def until(self, pending: Callable[[], tuple[str, str] | None], poll: float = POLL) -> None:
        """Poll ``pending()`` (whom it still waits for and why, None once done); raise ``error`` at the deadline."""
        while (status := pending()) is not None:
            if self.expired:
                raise self.error(*status)
            self.say(*status)
            self.sleep(poll)


def _whom(whom: str, why: str) -> str:
    return f"{whom}: {why}" if why else whom


class Pending(Generic[T]):
    """A blocking call running in a daemon thread: its result (or error) once it returns."""

    def __init__(self, call: Callable[[], T], name: str) -> None:
        self._done = threading.Event()
        self._result: T | None = None
        self._error: BaseException | None = None
        self._call = call
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            self._result = self._call()
        except BaseException as exc:  # handed to the waiting thread as it is
            self._error = exc
        self._done.set()

    def result(self, seconds: float) -> tuple[bool, T | None]:
        """(True, the result) once the call returned within ``seconds``, else (False, None); raises its error."""
        if not self._done.wait(max(seconds, 0.0)):
            return False, None
        if self._error is not None:
            raise self._error
        return True, self._result


def bounded(call: Callable[[], T], wait: Wait, whom: str, why: str, name: str = "bounded-call") -> T:
    """``call()``, given up at ``wait``'s deadline (its error, with ``why``) if it has not returned by then.

    For library calls that ignore their own timeout (torch's TCPStore client waits for a handshake that a
    frozen chief or a squatter on its port never sends). The call is left running in a daemon thread.
    """
    pending = Pending(call, name)
    while True:
        done, value = pending.result(min(wait.left, LOG_EVERY))
        if done:
            return cast(T, value)
        if wait.expired:
            raise wait.error(whom, why)
        wait.say(whom, why)
