"""How our processes end: as Python ends them, except the interpreter's finalization while torch's threads live.

torch's gloo process group frees each finished collective on its own worker thread, and a work can hold Python
objects (the ``PyObject`` of a tensor only the work still owns; the ``contextvars`` context autograd stashes
during backward, where DDP starts its all-reduce), so that thread takes the GIL to free it. When the last
collective finished just before the interpreter starts finalizing, the worker asks for the GIL during
finalization; Python ends such a thread with ``pthread_exit``, the unwinding meets a ``noexcept`` destructor
and the process aborts ("terminate called without an active exception", SIGABRT) although the training
finished. ``destroy_process_group`` does not prevent it: DDP keeps the group alive in C++, so its threads are
only stopped at finalization. A process where such threads are still alive therefore ends the way Python
would up to finalization (non-daemon threads joined, garbage collected, ``atexit`` handlers run, open files
and standard streams flushed) and then leaves with ``os._exit``. docs/ARCHITECTURE.md has the evidence. A
process may ask to leave the same way (``without_finalization``): a TensorFlow replica stopped by a signal, whose
runtime's teardown only costs time.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import os
import sys
import threading
from pathlib import Path
from typing import NoReturn

# Threads of torch's process groups that free works holding Python objects: gloo's workers (torch names them).
NATIVE_THREADS = ("pt_gloo_runloop",)
_WITHOUT_FINALIZATION: list[str] = []  # why this process leaves without it, besides torch's threads


def without_finalization(why: str) -> None:
    """Have ``end`` leave as it does while torch's threads live (``atexit``, files flushed, then ``os._exit``), for
    ``why``: a TensorFlow replica that stopped on a signal, whose runtime's teardown (its cluster's shutdown) takes
    seconds, under load 15 s and more, past the grace period, after its checkpoint and record are written."""
    _WITHOUT_FINALIZATION.append(why)


def native_threads() -> list[str]:
    """Names of this process's threads that must not meet Python's finalization (Linux; elsewhere none)."""
    found = []
    for task in Path("/proc/self/task").glob("*"):
        with contextlib.suppress(OSError):
            name = (task / "comm").read_text().strip()
            if name.startswith(NATIVE_THREADS):
                found.append(name)
    return found


def end(code: int) -> NoReturn:
    """End this process with ``code``; without the interpreter's finalization while torch's threads live, or when
    asked to (``without_finalization``)."""
    if not native_threads() and not _WITHOUT_FINALIZATION:
        sys.exit(code)
    shutdown = getattr(threading, "_shutdown", None)  # what finalization runs first: joins non-daemon threads
    if shutdown is not None:
        shutdown()
    gc.collect()
    atexit._run_exitfuncs()
    _flush_open_files()
    os._exit(code)


def now(code: int) -> NoReturn:
    """End this process with ``code`` at once, from any thread, nothing more of it run (no finalization, no
    ``atexit``: a job displaced from its job dir must write nothing more there); the standard streams flushed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _flush_open_files() -> None:
    """Flush what finalization would have: every open buffered file, then the standard streams."""
    for obj in gc.get_objects():
        # type(), not isinstance(): some objects (torch's deprecated aliases) warn when asked for __class__
        if issubclass(type(obj), (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)):
            with contextlib.suppress(Exception):
                if not obj.closed:
                    obj.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
