"""Watchdogs: a training loop that never gets going or stops stepping, and a framework start that never returns.

The hang watchdog has two clocks, one after the other. The start-up (the hooks loop's start, building the
datasets, the model and the optimizer, the group, the restore, the parallel wrap and the first training step) must
end within ``--startup-timeout``: a dataset download or a large model's load can be slow, and is as slow again on a
retry, so its expiry is permanent (class ``startup_timeout``, exit 124) and the message names the phase and the flag
to raise. The first step belongs to the start-up: it imports what the optimizer needs on first use
(``torch._dynamo``), traces and compiles (``--compile``, Keras' ``tf.function``), which takes a fresh process
seconds, on a loaded machine far more. From the end of the first step on, no training step may take longer than
``--hang-timeout``.

A collective's own timeout catches a peer that died; it does not catch a rank stuck in a data loader,
a deadlocked thread or an NCCL call that never returns. The loop calls ``beat(step)`` as it goes and
``trained(step)`` after each step, and sets ``phase``; a thread checks the time since the start and, after the
start-up, since the last beat. On expiry the process prints all its threads' stacks (faulthandler), writes its
failure record (naming its rank, the last step and where it stood) and exits: a hang (class ``hang``, or this rank
waiting for a peer whose heartbeat stopped, at either clock) with the retryable code, so the job restarts from its
newest checkpoint instead of burning its reservation. A phase that is live is not hung: an evaluation beats after
each batch, and while the loop waits for a batch the samples its datasets read (``progress``) count as beats. When
every earlier attempt of the process stalled in the same phase, the message says once which limit to raise.

A third clock starts at a stop signal (``stop_deadline``): the process ends within its ``--grace-period``, less a
margin for its record (``record_margin``), whatever holds it, and its record and last line say what was committed
(the caller's words); a node of one process enforces its grace period this way, as a launcher does for its workers.

The start deadline: TensorFlow's cluster start holds the GIL while it waits for a lost peer, so no thread of
the process can act. A small watcher process (``python -m entrypoint.lifecycle.watch.watchdog``, prepared before the
wait) writes the failure record and the job's last line at the deadline, then ends the waiting process with
SIGALRM (exit 142); the kernel's own alarm stays as a backstop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import functools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from entrypoint import errors, failures
from entrypoint.failures.records import FailureRecord
from entrypoint.lifecycle import signals
from entrypoint.lifecycle.watch import peers
from entrypoint.lifecycle.watch.peers import PeerBoard
from entrypoint.periodic import Periodic

BACKSTOP = 3.0  # seconds after the watcher's deadline: the kernel's alarm, should the watcher be gone
STOPPING_POLL = 0.1  # seconds between two looks at the stop's deadline once a stop signal arrived


@functools.cache
def reads() -> Any:
    """How many samples this process's datasets have read, its data-loader workers' included (shared memory, made
    once, before the workers start): the hang watchdog counts a read making progress as a beat."""
    return multiprocessing.RawValue("q", 0)


def record_margin(grace: float) -> float:
    """What a stopping process keeps of its ``--grace-period`` to write its record and end before the kill: a fifth
    of it, at most 2 s."""
    return min(2.0, grace / 5)


class HangWatchdog:
    """Fails this process when its start-up outlives ``startup_timeout``, or when, from the end of the first training
    step on, ``beat`` is not called for ``timeout`` seconds (either 0: that clock is off)."""

    def __init__(self, timeout: float, ctx: failures.FailureContext, startup_timeout: float = 0.0) -> None:
        self.timeout, self.startup_timeout, self.ctx = timeout, startup_timeout, ctx
        self.board: PeerBoard | None = None  # the peers' heartbeats, to name who this rank waits for
        self.progress: Callable[[], int] | None = None  # samples the loop's datasets read so far (a live read)
        self.phase = "starting"
        self.starting_up = True  # until the first training step completed (or nothing was left to train)
        self._step = 0
        self._read = 0
        self._allowance: tuple[float, str] = (0.0, "")  # seconds added to --hang-timeout until the next beat, and why
        self._began = self._last = time.monotonic()
        # a firing watchdog ends the process itself: its stop waits for no tick
        self._looks = Periodic("hang-watchdog", self._look, self._poll, join=0.0)
        self._deadline: tuple[signals.StopRequest, float, Callable[[], tuple[str, bool]]] | None = None

    @property
    def phase(self) -> str:
        """What the loop is doing (also in this process's failure records)."""
        return self._phase

    @phase.setter
    def phase(self, what: str) -> None:
        self._phase = self.ctx.phase = what

    def stop_deadline(self, request: signals.StopRequest, grace: float,
                      committed: Callable[[], tuple[str, bool]]) -> None:
        """From ``request``'s stop signal on, end this process ``grace`` seconds (its ``--grace-period``) less
        ``record_margin`` later, if it has not ended: its record and last line say what ``committed()`` says (in
        words, and whether every step it trained is committed: else its class is ``preempted_uncommitted``)."""
        self._deadline = (request, max(grace - record_margin(grace), 0.0), committed)

    def start(self) -> HangWatchdog:
        """Start watching (a daemon thread; the start-up clock starts now); a no-op when both timeouts are 0 and no
        stop has a deadline."""
        if (self.timeout > 0 or self.startup_timeout > 0 or self._deadline is not None) and not self._looks.started:
            self._began = self._last = time.monotonic()
            self._looks.start()
        return self

    @property
    def step(self) -> int:
        """The step of the last beat."""
        return self._step

    def beat(self, step: int, phase: str = "training", allowance: tuple[float, str] = (0.0, "")) -> None:
        """The loop goes on at ``step``, now ``phase`` (cheap: a few assignments). After the start-up the step clock
        starts again; during it the start-up clock runs on. ``allowance``: seconds this phase may take beyond
        ``--hang-timeout`` before it is a hang, and why (a framework's own wait with a known bound); the next beat
        ends it."""
        self._step, self.phase, self._allowance = step, phase, allowance
        if not self.starting_up:
            self._last = time.monotonic()
        self.ctx.step = step
        if self.board is not None:
            self.board.step = step

    def trained(self, step: int, phase: str = "training") -> None:
        """A training step completed: the start-up is over (if it was not), the step clock starts again."""
        self.end_startup()
        self.beat(step, phase)

    def end_startup(self) -> None:
        """The start-up is over (its first step completed, or nothing is left to train): the step clock starts."""
        if self.starting_up:
            self._last = time.monotonic()
            self.starting_up = False

    def stop(self) -> None:
        """Stop watching."""
        self._looks.stop()

    def _poll(self) -> float:
        limits = [t for t in (self.timeout, self.startup_timeout) if t > 0] or [1.0]
        if self._deadline is not None:  # a stop's deadline is seconds away: look often (a flag, no signal, wakes it)
            return STOPPING_POLL if self._deadline[0].requested else min(1.0, max(min(limits) / 4, STOPPING_POLL))
        return min(10.0, max(min(limits) / 4, 0.5))

    def expired(self, now: float) -> tuple[float, str] | None:
        """The limit that ran out at ``now`` (``time.monotonic()``) and its flag; None while time is left."""
        if self.starting_up:
            return (self.startup_timeout, "--startup-timeout") if 0 < self.startup_timeout < now - self._began \
                else None
        return (self.timeout, "--hang-timeout") if 0 < self.timeout < now - self._last - self._allowance[0] else None

    def _look(self) -> bool:
        """One look at the clocks; False once none is left to watch."""
        now = time.monotonic()
        if self._deadline is not None and self._deadline[0].requested:
            if self._deadline[0].since() >= self._deadline[1]:
                self._fire_stop()
            self._deadline[0].nudge()  # a region that held the stop past its patience is interrupted
            return True  # stopping: the stop's deadline holds, not the hang's clocks
        if not self.starting_up and self.timeout <= 0:
            return self._deadline is not None  # the start-up is over and the step clock is off
        self._live(now)
        if (limit := self.expired(now)) is not None:
            self._fire(*limit)
        return True

    def _live(self, now: float) -> None:
        """Samples read since the last look (a slow read or an evaluation making progress) are a beat."""
        if self.progress is None or self.starting_up:
            return
        read = self.progress()
        if read != self._read:
            self._read, self._last = read, now

    def _fire(self, limit: float, flag: str) -> None:
        rank = "" if self.ctx.rank is None else f"rank {self.ctx.rank} "
        waited = f"{limit:g} s ({flag})"
        if flag == "--startup-timeout":
            cls = errors.STARTUP_TIMEOUT
            message = f"{rank}on {self.ctx.replica} still {self.phase} after {waited}"
            advice = "; raise --startup-timeout if this start is expected to be slow"
        else:
            cls, advice = errors.HANG, ""
            if self._allowance[0] > 0:
                waited += f" and {self._allowance[0]:g} s more ({self._allowance[1]})"
            message = (f"no training step completed for {waited}: {rank}on {self.ctx.replica} "
                       f"stalled after step {self._step} while {self.phase}")
        if (attempts := failures.attempts_alike(self.ctx, cls.name, self.phase)) > 1:
            advice = (f"; the same at each of the {attempts} attempts so far: raise {flag} (now {limit:g} s) if "
                      f"{self.phase} takes longer")
        sys.stderr.write(f"entrypoint: {message}; Python stacks of every thread follow\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        silent = self.board.silent() if self.board is not None else []
        verdicts = []
        if silent:  # this rank waits for peers that stopped: they are the cause, named by their heartbeats
            cls, advice = errors.HANG, ""  # a lost peer, not a slow start: a restart can help
            message += f", waiting for {peers.describe(silent)}"
            for lost in silent:
                text = f"{peers.describe([lost])}; the others waited {waited}"
                verdicts.append(failures.record_verdict(self.ctx, lost.member.replica, lost.member.rank, errors.HANG,
                                                        text))
        own = failures.write_record(self.ctx, failures.Failure(cls, message + advice))
        code = failures.finish(self.ctx, own, blame=verdicts[0] if verdicts else None)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(code)

    def _fire_stop(self) -> None:
        """The stop outlived the grace period: say where it stood and what is committed, end as the signal does."""
        request, limit, committed = self._deadline or (signals.StopRequest(), 0.0, lambda: ("", True))
        name = signal.Signals(request.signum).name
        sys.stderr.write(f"entrypoint: still {self.phase} {limit:g} s after {name}: ending before the platform's "
                         "kill; Python stacks of every thread follow\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        words, kept = committed()
        message = f"stopped by {name}: its grace period ran out while {self.phase}; {words}"
        own = failures.write_record(self.ctx, failures.Failure(errors.signal_class(request.signum, kept), message))
        code = failures.finish(self.ctx, own)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(code)


@contextlib.contextmanager
def start_deadline(seconds: float, ctx: failures.FailureContext, failure: failures.Failure) -> Iterator[None]:
    """End this process with ``failure`` (record, last line, exit 142) if the block outlasts ``seconds``."""
    job = {"pid": os.getpid(), "seconds": seconds, "record": failures.make_record(ctx, failure).to_json(),
           "context": context_json(ctx)}
    watcher = subprocess.Popen([sys.executable, "-m", "entrypoint.lifecycle.watch.watchdog"], stdin=subprocess.PIPE,
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
    """``ctx`` as JSON values for the watcher process (its secrets, outputs and ledger hook stay here)."""
    values = {f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx) if f.name not in ("secrets", "outputs",
                                                                                            "on_end")}
    return {k: sorted(v) if isinstance(v, frozenset) else dict(v) if k == "starts" else v for k, v in values.items()}


def context_of(data: dict[str, Any]) -> failures.FailureContext:
    """The watcher's ``FailureContext`` back from ``context_json``."""
    return failures.FailureContext(**{**data, "before": frozenset(data.get("before", ())),
                                      "private": tuple(data.get("private", ()))})


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
