"""Signals in one place: what a training process does on SIGTERM, how parents forward it, and no orphans.

- ``StopRequest``: a training process's handler; SIGTERM/SIGINT only set a flag that the loop reads
  at a step boundary (every rank agrees, the chief commits a checkpoint, every process exits 128+N). Inside one of
  its interruptible regions (a phase where nothing is half done: waiting for a batch, building, restoring,
  exporting) the stop also raises ``Interrupted`` where the main thread stands, so no such phase holds it.
- ``terminate``: a supervisor forwards a signal to its children's process groups, waits up to the
  grace period, then SIGKILLs what is left (a child's own children that ignore the signal included).
- ``adopt_orphans`` / ``reap_adopted`` / ``end_adopted``: ``local`` is the subreaper of its replicas' descendants:
  it reaps those that end while the job runs (a SIGKILLed node's ranks, in sessions of their own, die with its
  launcher), and kills what outlived them (a user's helper in a session of its own) when the job ends, as a
  container's end does.
- ``die_with_parent``: every process we start gets PR_SET_PDEATHSIG, so whatever kills its parent
  (SIGKILL included) kills it too; nothing trains on as an orphan.
- ``deadline``: SIGALRM's default action ends a block the framework will not let us interrupt.
- ``stop_at_once``: for a process with nothing to save (a server, an evaluator), SIGTERM/SIGINT raise
  ``StopRequested`` where the main thread stands, so the failure funnel records it and exits 128+N.
- ``shield_loader_worker``: a data-loader worker ignores SIGTERM/SIGINT (its training process decides when
  to stop, and needs its batches until then) and dies with that process.
- ``watch_arrivals``: a thread hears SIGTERM/SIGINT arrive while the main thread is blocked in native code (whose
  Python handler runs only once the call returns): the clock of a grace period starts then.
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
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import FrameType

from entrypoint.errors import Interrupted, StopRequested, signal_exit_code

log = logging.getLogger("entrypoint")
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
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
    """Installed in a training process: SIGTERM/SIGINT set ``signum`` instead of killing the process.

    Inside an interruptible region (``enter``/``interruptible``) a stop also raises ``Interrupted`` in the main thread,
    once per process: at once (``patience`` 0: nothing waits on this process there), or once the region has held a
    stop for ``patience`` seconds (a wait for a batch that would end in a moment leaves the stop to the step vote;
    ``nudge``, called by the watchdog's thread, sends the signal again when the patience ran out).
    """

    def __init__(self) -> None:
        self.signum = 0
        self.received_at: float | None = None
        self.region: str | None = None  # what the main thread does where a stop ends it
        self._patience = 0.0
        self._held_since: float | None = None  # when the current region first held a stop
        self._raised = False
        self._main: int | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> StopRequest:
        """Take over SIGTERM and SIGINT (main thread only); idempotent."""
        self._main = threading.main_thread().ident
        for sig in STOP_SIGNALS:
            if sig not in self._previous:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def reinstall(self) -> None:
        """Take SIGTERM and SIGINT back after a framework set its own handler (TensorFlow's cluster start does)."""
        self.install()
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        """Give the signals their previous handlers back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if not self.signum:
            self.signum, self.received_at = signum, time.monotonic()
            # Written straight to the stream: logging from a signal handler can deadlock on its lock.
            where = "stopping at the next step boundary" if self.region is None else f"stopping ({self.region})"
            sys.stderr.write(f"entrypoint: received {signal.Signals(signum).name}: {where}\n")
        self._interrupt()

    def _interrupt(self) -> None:
        """In a region holding a stop past its patience, raise ``Interrupted`` (once: the stop's own commit is not
        interrupted again)."""
        if self.region is None or not self.signum or self._raised:
            return
        now = time.monotonic()
        if self._held_since is None:
            self._held_since = now
        if now - self._held_since >= self._patience:
            self._raised = True
            raise Interrupted(self.signum, self.region)

    def enter(self, what: str | None, patience: float = 0.0) -> None:
        """Start (``what``) or end (None) an interruptible region that spans calls; a stop that came before it
        counts from now."""
        self.region, self._patience, self._held_since = what, patience, None
        if what is not None:
            self._interrupt()

    @contextlib.contextmanager
    def interruptible(self, what: str, patience: float = 0.0) -> Iterator[None]:
        """Within the block a stop raises ``Interrupted`` (``enter``); the region before it is restored after."""
        previous = (self.region, self._patience, self._held_since)
        try:
            self.enter(what, patience)
            yield
        finally:
            self.region, self._patience, self._held_since = previous

    @contextlib.contextmanager
    def uninterrupted(self) -> Iterator[None]:
        """Within the block no stop raises ``Interrupted`` (a wait that must end: a write's commit before a failure's
        last line); the region before it is restored after, and a stop that came meanwhile counts from then on."""
        previous = (self.region, self._patience, self._held_since)
        try:
            self.region = None
            yield
        finally:
            self.region, self._patience, self._held_since = previous

    def nudge(self) -> None:
        """From another thread: signal the main thread again once a region has held a stop past its patience (a
        stop that came before the region, or a wait that outlasted the patience)."""
        held = self._held_since
        if self.region is None or not self.signum or self._raised or self._main is None:
            return
        if held is None or time.monotonic() - held >= self._patience:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pthread_kill(self._main, self.signum)

    @property
    def requested(self) -> bool:
        """Whether a stop signal arrived."""
        return self.signum != 0

    def since(self) -> float:
        """Seconds since the stop signal arrived (0 before one did)."""
        return time.monotonic() - self.received_at if self.received_at is not None else 0.0


def watch_arrivals(arrived: Callable[[int], None]) -> bool:
    """Call ``arrived(signum)`` from a daemon thread as soon as SIGTERM or SIGINT reaches this process, even while
    the main thread is blocked in native code (a framework's step), where Python runs its handlers only once the
    call returns: the C handler writes each signal's number to the wakeup fd this thread reads. Main thread only;
    False (nothing watched) when another wakeup fd is set already (asyncio's)."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    if previous != -1:  # someone else's: give it back
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)
        return False

    def watch() -> None:
        while data := os.read(read, 64):
            for signum in data:
                if signum in STOP_SIGNALS:
                    arrived(signum)

    threading.Thread(target=watch, name="signal-arrivals", daemon=True).start()
    return True


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Send ``sig`` to a child's process group (it was started in a new session), if it still runs."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


def terminate(procs: Sequence[subprocess.Popen[bytes]], sig: int, grace: float) -> None:
    """Forward ``sig`` to every child's group; SIGKILL the groups still running after ``grace`` seconds.

    A group outlives its leader when the leader's own children ignore the signal: they get the rest of the grace
    period, then SIGKILL too (nothing of a stopped child is left running)."""
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
    for proc in procs:
        _end_group(proc.pid, deadline, sig)


def _end_group(pgid: int, deadline: float, sig: int) -> None:
    """Wait until the deadline for what is left of a group whose leader ended, then SIGKILL it."""
    while _in_group(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _in_group(pgid)
    if not left:
        return
    log.warning("pids %s of pid %d's process group still running after %s and the grace period: killing them",
                ", ".join(map(str, left)), pgid, signal.Signals(sig).name)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    ends = time.monotonic() + 5.0
    while _in_group(pgid) and time.monotonic() < ends:
        time.sleep(0.05)


def _processes() -> Iterator[tuple[int, str, int, int]]:
    """Every process as (pid, state, parent pid, process group), from Linux's /proc (nothing elsewhere)."""
    root = Path("/proc")
    if not root.is_dir():
        return
    for entry in root.iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "stat").read_text()
            except OSError:
                continue
            state, ppid, group = text[text.rindex(")") + 2:].split()[:3]
            yield int(entry.name), state, int(ppid), int(group)


def _in_group(pgid: int) -> list[int]:
    """The live (not zombie) members of process group ``pgid``."""
    return [pid for pid, state, _ppid, group in _processes() if group == pgid and state != "Z"]


def adopt_orphans() -> None:
    """Become the subreaper of this process's descendants (Linux; elsewhere nothing): a process that left its
    parent's group or session (a daemon-style helper of the user's) is re-parented here when its parent ends,
    instead of to init, so ``end_adopted`` can end it as a container's end would."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def kill_descendants() -> list[int]:
    """SIGKILL every descendant of this process at once (nothing they would do on a gentler signal, a last
    checkpoint, happens); the pids killed. Each sweep finds the whole tree before killing any of it."""
    mine, killed = os.getpid(), set[int]()
    for _ in range(5):  # what forked during a sweep
        children: dict[int, list[int]] = {}
        for pid, state, ppid, _group in _processes():
            if state != "Z":
                children.setdefault(ppid, []).append(pid)
        tree: set[int] = set()
        todo = [mine]
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in tree:
                    tree.add(child)
                    todo.append(child)
        if not tree - killed:
            break
        for pid in tree - killed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed |= tree
    return sorted(killed)


def reap_adopted(started: Iterable[int]) -> list[int]:
    """Reap every child of this process it did not start itself that has ended (an adopted descendant: a rank of a
    SIGKILLed node that died with its launcher), as init would at once; the pids reaped. Those still running are
    left alone (``end_adopted`` ends them with the job), and so is a child in this process's own group: one a thread
    of ours started (``subprocess.run``), whose exit status its own wait must still read."""
    mine, own_group, known, reaped = os.getpid(), os.getpgrp(), set(started), []
    for pid, state, ppid, group in _processes():
        if ppid == mine and state == "Z" and pid not in known and group != own_group:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
                reaped.append(pid)
    return reaped


def end_adopted(started: Iterable[int]) -> list[int]:
    """SIGKILL and reap every child of this process it did not start itself (descendants adopted after their
    parents ended), as a container's end kills what is left in it; the pids ended (those that had ended already
    are reaped, not named)."""
    mine, ended, known = os.getpid(), [], set(started)
    for _ in range(5):  # an adopted process's own children are adopted in turn once it ends
        reap_adopted(known)
        strays = [pid for pid, state, ppid, _group in _processes() if ppid == mine and pid not in known
                  and state != "Z"]
        if not strays:
            break
        log.warning("pids %s outlived the job (started by the user's code, outside its replica's process group): "
                    "killing them", ", ".join(map(str, strays)))
        for pid in strays:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for pid in strays:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        ended += strays
    return ended


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
