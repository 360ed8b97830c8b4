"""A periodic background thread: the one way a module runs "do this every N seconds until stopped".

``Periodic(name, tick, interval)`` calls ``tick()`` in a thread of that name, ``interval`` seconds apart, until
``stop()``. The owners that keep such a thread (the heartbeats, the hang watchdog, the server watch, the job dir's
lease renewal, the ledger's uploads, the platform's advance notice, Kubeflow Trainer's progress) say only what one
tick does and how long to wait:

- ``interval``: seconds, or a function asked before each wait (a watchdog that looks more often once a stop has a
  deadline); None (or a function returning None) waits until ``wake()`` or ``stop()``.
- ``initial``: the wait before the first tick (default: the interval).
- ``tick()`` returning ``False`` ends the thread (a lease taken over by another job, a watchdog with no clock left);
  any other value goes on.
- ``wake()`` ends the current wait at once: the next tick runs now (a new update to post).
- ``on_error``: what an exception of ``tick`` does. None (the default): it ends the thread and reaches
  ``threading.excepthook`` (its traceback on stderr), as in a thread written by hand. A function: called with the
  exception, True goes on with the next tick, False ends the thread quietly.
- ``stop()`` ends the waiting at once, then joins the thread for at most ``join`` seconds (a tick in flight
  finishes first; 0: not waited for, e.g. a hanging HTTP request the thread cannot interrupt). It may be called
  more than once, before ``start()``, and from the thread itself (not joined then).
- ``daemon`` (default True): the thread does not hold the process at its exit.

Imports nothing of ours (layer 0), so every layer can use it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Interval = float | None | Callable[[], float | None]


class Periodic:
    """One named background thread calling ``tick`` every ``interval`` seconds until stopped."""

    def __init__(self, name: str, tick: Callable[[], object], interval: Interval, *, initial: float | None = None,
                 daemon: bool = True, join: float = 5.0,
                 on_error: Callable[[Exception], bool] | None = None) -> None:
        self.name, self.daemon, self.join = name, daemon, join
        self._tick, self._interval, self._initial, self._on_error = tick, interval, initial, on_error
        self._wake = threading.Event()
        self._stopped = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        """Whether ``start`` ran (the thread may have ended since)."""
        return self._thread is not None

    @property
    def alive(self) -> bool:
        """Whether the thread runs now."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def stopping(self) -> bool:
        """Whether ``stop`` was called."""
        return self._stopped

    def start(self) -> Periodic:
        """Start the thread (once: a second call, or one after ``stop``, does nothing)."""
        with self._lock:
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=self.daemon)
                self._thread.start()
        return self

    def wake(self) -> None:
        """Run the next tick now instead of at the end of the current wait."""
        self._wake.set()

    def stop(self, join: float | None = None) -> None:
        """Stop ticking; wait at most ``join`` seconds (default: the one given at construction) for a tick in
        flight. Idempotent."""
        with self._lock:
            self._stopped = True
            thread = self._thread
        self._wake.set()
        bound = self.join if join is None else join
        if thread is not None and thread is not threading.current_thread() and bound > 0:
            thread.join(timeout=bound)

    def _seconds(self, first: bool) -> float | None:
        if first and self._initial is not None:
            return self._initial
        return self._interval() if callable(self._interval) else self._interval

    def _wait(self, seconds: float | None) -> None:
        if seconds is None or seconds > 0:
            self._wake.wait(seconds)
        self._wake.clear()

    def _run(self) -> None:
        first = True
        while not self._stopped:
            self._wait(self._seconds(first))
            first = False
            if self._stopped:
                return
            try:
                if self._tick() is False:
                    return
            except Exception as exc:
                if self._on_error is None:
                    raise
                if not self._on_error(exc):
                    return
