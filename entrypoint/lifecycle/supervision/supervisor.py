"""Supervise a set of local processes: prefixed output, signals forwarded, failures handled by a restart policy.

Used by ``local`` (one process per emulated replica, restarted as the emulated platform would) and by the
Horovod launcher (one per GPU; the first failure stops the rest). Each child runs in its own process group
and dies with its supervisor (``signals.child_preexec``); a stop reaches every group, and whatever still
runs after the grace period is killed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from entrypoint.errors import exit_code_of, is_retryable, signal_exit_code
from entrypoint.lifecycle.signals import Forwarder, child_preexec, terminate
from entrypoint.lifecycle.supervision.restart_policy import Counts, Decision, RestartPolicy, decide
from entrypoint.options import DEFAULT_GRACE_PERIOD
from entrypoint.outputs import redaction

NEVER = RestartPolicy("never")
TEND_EVERY = 1.0  # seconds between two calls of a supervisor's ``tend`` while the job runs


@dataclass
class Replica:
    """One supervised process: its name parts, environment, command, attempt and (once started) process."""

    pool: str
    index: int
    env: dict[str, str]
    argv: list[str] = field(default_factory=list)
    cwd: str | None = None
    attempt: int = 0  # 0 for the first start, n for the n-th restart
    started_at: float = 0.0  # wall time of the latest start
    proc: subprocess.Popen[bytes] | None = None
    pump: threading.Thread | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        """The replica name, e.g. ``workerpool1-0``."""
        return f"{self.pool}-{self.index}"

    @property
    def prefix(self) -> str:
        """The log prefix: the name, and the attempt once restarted (``workerpool1-0#2``)."""
        return self.name if self.attempt == 0 else f"{self.name}#{self.attempt}"

    @property
    def exit_code(self) -> int | None:
        """Its exit status as the shell reports it (None while running)."""
        returncode = self.proc.poll() if self.proc is not None else None
        return None if returncode is None else exit_code_of(returncode)


@dataclass
class Outcome:
    """How the supervised job ended: its exit code, the replica that ended it, and why."""

    code: int
    first: Replica | None = None  # the replica whose exit ended the job (None: success or a signal)
    why: str = ""  # why no restart followed (a permanent failure, an exhausted budget, ...)
    counts: Counts = field(default_factory=Counts)


def _pump(prefix: str, stream: IO[bytes], lock: threading.Lock, secrets: frozenset[str]) -> None:
    for raw in iter(stream.readline, b""):
        line = redaction.hide(raw.decode(errors="replace").rstrip("\n"), secrets)  # a user's print() too
        with lock:
            sys.stdout.write(f"[{prefix}] {line}\n")
            sys.stdout.flush()


class Supervisor:
    """Starts replicas, prefixes their output, and applies a restart policy to the ones that fail.

    ``prepare`` runs before every start (fresh scratch directories, the attempt number in the environment);
    ``on_failure`` runs for every failed exit before the policy decides (a record on the replica's behalf);
    ``secrets`` are hidden in every line of the replicas' output it passes on; ``tend`` runs about once a second
    while the job runs (``local``: reap the descendants it adopted that ended).
    """

    def __init__(self, replicas: list[Replica], label: str = "local", grace: float = DEFAULT_GRACE_PERIOD,
                 policy: RestartPolicy = NEVER, prepare: Callable[[Replica], None] | None = None,
                 on_failure: Callable[[Replica, int], None] | None = None,
                 secrets: frozenset[str] = frozenset(), tend: Callable[[], object] | None = None) -> None:
        self.replicas, self.label, self.grace, self.policy = replicas, label, grace, policy
        self.prepare, self.on_failure, self.secrets, self.tend = prepare, on_failure, secrets, tend
        self.counts = Counts()
        self._lock = threading.Lock()
        self._chief_done = False

    def say(self, text: str) -> None:
        """One line of the supervisor's own, prefixed with its label."""
        with self._lock:
            sys.stdout.write(f"[{self.label}] {text}\n")
            sys.stdout.flush()

    def _start(self, replica: Replica) -> None:
        if self.prepare is not None:
            self.prepare(replica)
        replica.started_at = time.time()
        replica.proc = subprocess.Popen(replica.argv, env=replica.env, cwd=replica.cwd, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=child_preexec)
        assert replica.proc.stdout is not None
        replica.pump = threading.Thread(target=_pump, args=(replica.prefix, replica.proc.stdout, self._lock,
                                                            self.secrets), daemon=True)
        replica.pump.start()

    def _procs(self) -> list[subprocess.Popen[bytes]]:
        return [r.proc for r in self.replicas if r.proc is not None]

    def run(self) -> Outcome:
        """Run the job to its end; a stop signal is forwarded to every replica and ends it."""
        with Forwarder() as forwarder:
            try:
                for r in self.replicas:
                    self._start(r)
                outcome = self._wait(forwarder)
            except BaseException:
                terminate(self._procs(), signal.SIGKILL, 0)
                raise
        for r in self.replicas:
            if r.pump is not None:
                r.pump.join(timeout=5)
        outcome.counts = self.counts
        return outcome

    def _wait(self, forwarder: Forwarder) -> Outcome:
        handled: set[int] = set()  # pids whose exit was dealt with
        chief_done_at: float | None = None
        tended = time.monotonic()
        while True:
            if self.tend is not None and time.monotonic() - tended >= TEND_EVERY:
                self.tend()
                tended = time.monotonic()
            if forwarder.received:
                sig = forwarder.received[0]
                name = signal.Signals(sig).name
                self.say(f"received {name}: forwarding it to every process (grace {self.grace:g} s)")
                terminate(self._procs(), sig, self.grace)
                return Outcome(signal_exit_code(sig))
            for r in self.replicas:
                code = r.exit_code
                if code is None or r.proc is None or r.proc.pid in handled:
                    continue
                handled.add(r.proc.pid)
                if code == 0:
                    if r is self.replicas[0] and self.policy.kind != "never":
                        self._chief_done, chief_done_at = True, time.monotonic()
                    continue
                outcome = self._failed(r, code)
                if outcome is not None:
                    return outcome
            if all(r.exit_code == 0 for r in self.replicas):
                return Outcome(0)
            if chief_done_at is not None and time.monotonic() - chief_done_at > self.grace:
                left = [r for r in self.replicas if r.exit_code is None]
                self.say(f"the chief finished the job {self.grace:g} s ago: stopping {', '.join(r.name for r in left)}")
                terminate([r.proc for r in left if r.proc is not None], signal.SIGTERM, self.grace)
                return Outcome(0)
            time.sleep(0.1)

    def _failed(self, replica: Replica, code: int) -> Outcome | None:
        """Apply the policy to a failed exit; an Outcome when the job ends."""
        if self.on_failure is not None:
            self.on_failure(replica, code)
        kind = "retryable" if is_retryable(code) else "permanent"
        decision = decide(self.policy, self.counts, replica.name, code)
        if self._chief_done and decision.action != "end":
            decision = Decision("end", why="the chief already finished the job")
        if decision.action == "restart_replica":
            self.say(f"{replica.name} exited {code} ({kind}): restart {decision.number} of {decision.budget}")
            replica.attempt += 1
            self._start(replica)
            return None
        if decision.action == "restart_job":
            self.say(f"{replica.name} exited {code} ({kind}): restarting every replica (job restart "
                     f"{decision.number} of {decision.budget})")
            terminate([p for p in self._procs() if p.poll() is None], signal.SIGTERM, self.grace)
            for r in self.replicas:
                r.attempt += 1
                self._start(r)
            return None
        self.say(f"{replica.name} exited with {code} ({kind}): stopping the others")
        terminate([p for p in self._procs() if p.poll() is None], signal.SIGTERM, self.grace)
        return Outcome(code, replica, decision.why)


def run_replicas(replicas: list[Replica], label: str = "local", grace: float = DEFAULT_GRACE_PERIOD,
                 policy: RestartPolicy = NEVER, secrets: frozenset[str] = frozenset()) -> Outcome:
    """Start every replica and wait; a signal or a failure the policy does not restart stops the others.
    ``secrets`` are hidden in every line of their output passed on."""
    return Supervisor(replicas, label, grace, policy, secrets=secrets).run()
