"""Watchdogs: a training loop that stops stepping, and a framework start that never returns.

The hang watchdog: when no training step completes for ``--hang-timeout``, dump every Python stack and fail.

A collective's own timeout catches a peer that died; it does not catch a rank stuck in a data loader,
a deadlocked thread or an NCCL call that never returns. The loop calls ``beat(step)`` after each step
and sets ``phase``; a thread checks the time since the last beat. On expiry the process prints all
its threads' stacks (faulthandler), writes its failure record (class ``hang``, naming its rank, the
last step and where it stood) and exits with the retryable code, so the job restarts from its newest
checkpoint instead of burning its reservation.

The start deadline: TensorFlow's cluster start holds the GIL while it waits for a lost peer, so no thread of
the process can act. A small watcher process (``python -m entrypoint.lifecycle.watchdog``, prepared before the wait)
writes the failure record and the job's last line at the deadline, then ends the waiting process with
SIGALRM (exit 142); the kernel's own alarm stays as a backstop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from entrypoint import errors, failures
from entrypoint.failures.records import FailureRecord
from entrypoint.lifecycle import peers, signals
from entrypoint.lifecycle.peers import PeerBoard

BACKSTOP = 3.0  # seconds after the watcher's deadline: the kernel's alarm, should the watcher be gone


class HangWatchdog:
    """Fails this process when ``beat`` is not called for ``timeout`` seconds (0: off)."""

    def __init__(self, timeout: float, ctx: failures.FailureContext) -> None:
        self.timeout, self.ctx = timeout, ctx
        self.board: PeerBoard | None = None  # the peers' heartbeats, to name who this rank waits for
        self.phase = "starting"
        self._step = 0
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> HangWatchdog:
        """Start watching (a daemon thread); a no-op when the timeout is 0."""
        if self.timeout > 0 and self._thread is None:
            self._last = time.monotonic()
            self._thread = threading.Thread(target=self._watch, name="hang-watchdog", daemon=True)
            self._thread.start()
        return self

    @property
    def step(self) -> int:
        """The step of the last beat."""
        return self._step

    def beat(self, step: int, phase: str = "training") -> None:
        """A training step completed (cheap: a few assignments)."""
        self._step, self._last, self.phase = step, time.monotonic(), phase
        self.ctx.step = step
        if self.board is not None:
            self.board.step = step

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(10.0, max(self.timeout / 4, 0.5))):
            if time.monotonic() - self._last > self.timeout:
                self._fire()

    def _fire(self) -> None:
        rank = "" if self.ctx.rank is None else f"rank {self.ctx.rank} "
        message = (f"no training step completed for {self.timeout:g} s (--hang-timeout): {rank}on {self.ctx.replica} "
                   f"stalled after step {self._step} while {self.phase}")
        sys.stderr.write(f"entrypoint: {message}; Python stacks of every thread follow\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        silent = self.board.silent() if self.board is not None else []
        verdicts = []
        if silent:  # this rank waits for peers that stopped: they are the cause, named by their heartbeats
            message += f", waiting for {peers.describe(silent)}"
            for lost in silent:
                text = f"{peers.describe([lost])}; the others waited {self.timeout:g} s (--hang-timeout)"
                verdicts.append(failures.record_verdict(self.ctx, lost.member.replica, lost.member.rank, errors.HANG,
                                                        text))
        own = failures.write_record(self.ctx, failures.Failure(errors.HANG, message))
        code = failures.finish(self.ctx, own, blame=verdicts[0] if verdicts else None)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(code)


@contextlib.contextmanager
def start_deadline(seconds: float, ctx: failures.FailureContext, failure: failures.Failure) -> Iterator[None]:
    """End this process with ``failure`` (record, last line, exit 142) if the block outlasts ``seconds``."""
    job = {"pid": os.getpid(), "seconds": seconds, "record": failures.make_record(ctx, failure).to_json(),
           "context": context_json(ctx)}
    watcher = subprocess.Popen([sys.executable, "-m", "entrypoint.lifecycle.watchdog"], stdin=subprocess.PIPE,
                               preexec_fn=signals.child_preexec)
    assert watcher.stdin is not None
    with contextlib.suppress(OSError):  # a watcher that could not start leaves the backstop to end the wait
        watcher.stdin.write(json.dumps(job).encode())
        watcher.stdin.close()
    try:
        with signals.deadline(seconds + BACKSTOP):
            yield
    finally:
        watcher.kill()
        watcher.wait()


def context_json(ctx: failures.FailureContext) -> dict[str, Any]:
    """``ctx`` as JSON values for the watcher process (its secrets and outputs stay here)."""
    return {k: sorted(v) if isinstance(v, frozenset) else v
            for k, v in dataclasses.asdict(ctx).items() if k not in ("secrets", "outputs")}


def context_of(data: dict[str, Any]) -> failures.FailureContext:
    """The watcher's ``FailureContext`` back from ``context_json``."""
    return failures.FailureContext(**{**data, "before": frozenset(data.get("before", ()))})


def _watch_start(job: dict[str, Any]) -> int:
    """The watcher: at the deadline, record the parent's failure, print the job's last line, send SIGALRM."""
    pid = int(job["pid"])
    signals.die_with_parent(signal.SIGKILL, expected_parent=pid)
    time.sleep(float(job["seconds"]))
    ctx = context_of(job["context"])
    record = FailureRecord.from_json(job["record"])
    assert record is not None
    failures.finish(ctx, record.stamped(), stored=False)
    os.kill(pid, signal.SIGALRM)
    return 0


if __name__ == "__main__":
    sys.exit(_watch_start(json.loads(sys.stdin.read())))
