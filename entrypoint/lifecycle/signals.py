"""Signals in one place: what a training process does on SIGTERM, how parents forward it, and no orphans.

- ``StopRequest``: a training process's handler; SIGTERM/SIGINT only set a flag that the loop reads
  at a step boundary (every rank agrees, the chief commits a checkpoint, every process exits 128+N).
- ``terminate``: a supervisor forwards a signal to its children's process groups, waits up to the
  grace period, then SIGKILLs what is left.
- ``die_with_parent``: every process we start gets PR_SET_PDEATHSIG, so whatever kills its parent
  (SIGKILL included) kills it too; nothing trains on as an orphan.
- ``deadline``: SIGALRM's default action ends a block the framework will not let us interrupt.
- ``stop_at_once``: for a process with nothing to save (a server, an evaluator), SIGTERM/SIGINT raise
  ``StopRequested`` where the main thread stands, so the failure funnel records it and exits 128+N.
- ``shield_loader_worker``: a data-loader worker ignores SIGTERM/SIGINT (its training process decides when
  to stop, and needs its batches until then) and dies with that process.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from types import FrameType

from entrypoint.errors import StopRequested, signal_exit_code

log = logging.getLogger("entrypoint")
_PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def die_with_parent(sig: int = signal.SIGKILL, expected_parent: int | None = None) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux; a no-op elsewhere).

    When the parent is already gone (we were re-parented before asking), exit at once.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(signal_exit_code(sig))


def shield_loader_worker(_worker_id: int) -> None:
    """A DataLoader's ``worker_init_fn``: stop signals are for the training process; die with it.

    Sent to the whole process group (tini -g, ``local``, Kubernetes), SIGTERM would otherwise end the
    workers first and fail the step the training process is about to commit.
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    die_with_parent(signal.SIGKILL)


def child_preexec() -> None:
    """``preexec_fn`` for every child we start: it dies with us (its parent is the process that forks it)."""
    die_with_parent(signal.SIGKILL)


class StopRequest:
    """Installed in a training process: SIGTERM/SIGINT set ``signum`` instead of killing the process."""

    def __init__(self) -> None:
        self.signum = 0
        self.received_at: float | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> StopRequest:
        """Take over SIGTERM and SIGINT (main thread only); idempotent."""
        for sig in STOP_SIGNALS:
            if sig not in self._previous:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        """Give the signals their previous handlers back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if not self.signum:
            self.signum, self.received_at = signum, time.monotonic()
            # Written straight to the stream: logging from a signal handler can deadlock on its lock.
            sys.stderr.write(f"entrypoint: received {signal.Signals(signum).name}: stopping at the next step "
                             "boundary\n")

    @property
    def requested(self) -> bool:
        """Whether a stop signal arrived."""
        return self.signum != 0


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Send ``sig`` to a child's process group (it was started in a new session), if it still runs."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


def terminate(procs: Sequence[subprocess.Popen[bytes]], sig: int, grace: float) -> None:
    """Forward ``sig`` to every child's group; SIGKILL the groups still running after ``grace`` seconds."""
    for proc in procs:
        signal_group(proc, sig)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("pid %d still running %.0f s after %s: killing it", proc.pid, grace,
                        signal.Signals(sig).name)
            signal_group(proc, signal.SIGKILL)
            proc.wait()


class Forwarder:
    """A supervisor's handler: SIGTERM/SIGINT are remembered and forwarded by its wait loop."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Forwarder:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, lambda s, _f: self.received.append(s))
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """End the process by SIGALRM (exit 142, retryable) if the block outlasts ``seconds``.

    For framework calls that hold the GIL and swallow SIGTERM while they wait (TensorFlow's cluster
    start): neither a Python timer nor a handler could stop them; the kernel's default action can.
    """
    previous = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(max(1, math.ceil(seconds)))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def stop_at_once(what: str) -> Iterator[None]:
    """Within the block, the first SIGTERM/SIGINT raises ``StopRequested`` at once; later ones are ignored.

    For processes with nothing to save: the exception reaches the failure funnel from wherever the main
    thread runs Python code (a poll loop, between a framework's steps), which records it and exits 128+N.
    """
    stopping: list[int] = []

    def handle(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stopping:
            sys.stderr.write(f"entrypoint: received {name} again: already stopping\n")
            return
        stopping.append(signum)
        raise StopRequested(signum, f"stopped by {name} while {what}")

    previous = {sig: signal.signal(sig, handle) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        if not stopping:  # stopping: keep ignoring repeats while the funnel records the stop
            for sig, handler in previous.items():
                signal.signal(sig, handler)
