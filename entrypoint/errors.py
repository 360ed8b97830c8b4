"""The one table of exit codes and failure classes, and the errors that carry them (docs/EXIT_CODES.md)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes: permanent below 128, retryable at 128 and above (Kubeflow's ExitCode policy).

    A process stopped by signal N exits 128 + N (``signal_exit_code``, ``signal_class``): 130 for SIGINT,
    143 for SIGTERM (class ``preempted``); those codes come from the signal, so they are not members here.
    """

    OK = 0
    USER_CODE = 1  # the user's code raised, exited early, or a script exited non-zero
    CONFIG = 2  # configuration or usage error: fix the job, do not retry
    NONFINITE_LOSS = 65  # the training loss became NaN or infinite (sysexits EX_DATAERR): fix data or hyperparameters
    OUTPUT_NOT_WRITABLE = 73  # an output directory is read-only or not ours to write (sysexits EX_CANTCREAT)
    DISK_FULL = 74  # no space left where outputs go (sysexits EX_IOERR)
    STARTUP_TIMEOUT = 124  # the start-up outlived --startup-timeout (timed out, as timeout(1)): a retry is as slow
    PEER_LOST = 129  # a peer never came, died or froze; a rendezvous, collective or training step timed out
    START_DEADLINE = 142  # SIGALRM: TensorFlow's cluster start outlived --timeout (it cannot be interrupted otherwise)
    HOST_UNRESOLVABLE = 196  # a peer's host name never resolved (128 + sysexits EX_NOHOST, made retryable)
    STORAGE_UNAVAILABLE = 197  # the object store (gs://) was unreachable or failing (128 + EX_UNAVAILABLE, retryable)


def signal_exit_code(signum: int) -> int:
    """The exit status of a process ended by (or stopping for) signal ``signum``, as the shell reports it."""
    return 128 + int(signum)


def exit_code_of(returncode: int) -> int:
    """A child's exit status as the shell reports it (``Popen.returncode`` is -N when signal N killed it)."""
    return signal_exit_code(-returncode) if returncode < 0 else returncode


def sys_exit_code(exc: SystemExit) -> int:
    """``sys.exit(x)`` as the shell sees it: None is 0, an int modulo 256 (``sys.exit(256)`` exits 0, ``-1`` 255),
    anything else (a message) 1."""
    if exc.code is None:
        return ExitCode.OK
    return exc.code & 0xFF if isinstance(exc.code, int) else ExitCode.USER_CODE


def is_retryable(code: int) -> bool:
    """Whether a restart can help (Kubeflow's ExitCode restart policy reads codes the same way)."""
    return code >= 128


@dataclass(frozen=True)
class FailureClass:
    """A row of the failure table: the class name users read, its exit code and why it is (not) retried."""

    name: str
    exit_code: int
    meaning: str


USER_CODE = FailureClass("user_code", ExitCode.USER_CODE, "the user's code failed")
CONFIG = FailureClass("config", ExitCode.CONFIG, "configuration or usage error")
OUTPUT_NOT_WRITABLE = FailureClass("output_not_writable", ExitCode.OUTPUT_NOT_WRITABLE,
                                   "an output directory is read-only or not writable")
DISK_FULL = FailureClass("disk_full", ExitCode.DISK_FULL, "no space left on the output volume")
NONFINITE_LOSS = FailureClass("nonfinite_loss", ExitCode.NONFINITE_LOSS, "the training loss became NaN or infinite")
PEER_LOST = FailureClass("peer_lost", ExitCode.PEER_LOST, "a peer is missing, died, froze or timed out")
HANG = FailureClass("hang", ExitCode.PEER_LOST, "no training step completed within --hang-timeout")
STARTUP_TIMEOUT = FailureClass("startup_timeout", ExitCode.STARTUP_TIMEOUT,
                               "the start-up (building, restoring, the first step) outlived --startup-timeout")
HOST_UNRESOLVABLE = FailureClass("host_unresolvable", ExitCode.HOST_UNRESOLVABLE, "a peer's host name never resolved")
STORAGE_UNAVAILABLE = FailureClass("storage_unavailable", ExitCode.STORAGE_UNAVAILABLE,
                                   "the object store holding the outputs was unreachable or failing")
START_DEADLINE = FailureClass("peer_lost", ExitCode.START_DEADLINE,
                              "the framework's cluster start outlived --timeout (a start it cannot interrupt)")
PREEMPTED = "preempted"  # the class of a process stopped by SIGTERM (the platform's preemption or stop)
# SIGTERM, and steps this process trained could not be committed (its grace period ran out, or a sharded model's
# ranks could not meet): a job is never reported ``preempted`` with a step it did not commit.
PREEMPTED_UNCOMMITTED = "preempted_uncommitted"
# Classes a failure of another replica can cause: the root cause is looked for elsewhere first.
CONSEQUENCES = frozenset({PEER_LOST.name, HANG.name})


def signal_class(signum: int, committed: bool = True) -> FailureClass:
    """The class of a process ended by (or stopping for) signal ``signum``: 128 + its number (``committed``: the
    steps it trained are committed; else a SIGTERM is ``preempted_uncommitted``)."""
    import signal

    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    kind = (PREEMPTED if committed else PREEMPTED_UNCOMMITTED) if signum == signal.SIGTERM else "signal"
    return FailureClass(kind, signal_exit_code(signum), f"stopped by {name}")


class TrainerError(Exception):
    """Base of the errors the entrypoint raises itself: each knows its failure class."""

    failure: FailureClass = USER_CODE

    @property
    def exit_code(self) -> int:
        """The process exit code for this error."""
        return int(self.failure.exit_code)


class ConfigError(TrainerError):
    """A partial, contradictory or malformed configuration: one line naming the variable (or flag) and path."""

    failure = CONFIG

    def __init__(self, source: str, problem: str, path: str | None = None) -> None:
        self.source = f"{source}: {path}" if path else source  # the variable or flag (and JSON path) at fault
        self.problem = problem
        super().__init__(f"{self.source}: {problem}")


class PeerError(TrainerError):
    """A peer never came, died or froze, or a rendezvous / collective timed out: retry the job."""

    failure = PEER_LOST


class HostUnresolvableError(TrainerError):
    """A peer's host name did not resolve within --timeout (a new pod's DNS record can lag): retry."""

    failure = HOST_UNRESOLVABLE


class OutputError(TrainerError):
    """An output could not be written: a read-only or foreign directory, or a full disk."""

    def __init__(self, failure: FailureClass, message: str) -> None:
        self.failure = failure
        super().__init__(message)


class NonFiniteLoss(TrainerError):
    """Every rank agreed that the loss of a step was NaN or infinite (``--on-nonfinite fail``)."""

    failure = NONFINITE_LOSS


class StopRequested(TrainerError):
    """A stop on a signal, the newest state committed (``committed`` False: it could not be). Exit 128 + the
    signal number."""

    def __init__(self, signum: int, message: str, committed: bool = True) -> None:
        self.failure = signal_class(signum, committed)
        super().__init__(message)


class Interrupted(BaseException):
    """A stop signal ended an interruptible region of a training process at once (``lifecycle/signals.py``): a
    ``BaseException``, as ``KeyboardInterrupt`` is, so that no hook's or library's ``except Exception`` holds it (a
    checkpoint that "does not load" because the restore was interrupted); the hooks loop turns it into a
    ``StopRequested`` that says what is committed. ``what``: the region."""

    def __init__(self, signum: int, what: str) -> None:
        self.signum, self.what = signum, what
        self.failure = signal_class(signum)
        super().__init__(f"stopped by {self.failure.meaning.removeprefix('stopped by ')} while {what}")
