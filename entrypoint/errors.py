"""Error types and the one table of exit codes (see docs/EXIT_CODES.md)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes: permanent below 128, retryable at 128 and above (Kubeflow ExitCode policy)."""

    OK = 0
    USER_CODE = 1  # the user's code raised or exited non-zero
    CONFIG = 2  # configuration or usage error: fix the job, do not retry
    PEER_TIMEOUT = 129  # a peer never joined / rendezvous or collective timed out: retry
    INTERRUPTED = 130  # SIGINT (Ctrl-C)
    PREEMPTED = 143  # SIGTERM, e.g. preemption or the job being stopped


class TrainerError(Exception):
    """Base of errors the CLI turns into an exit code and a one-line message."""

    exit_code: int = ExitCode.USER_CODE


class ConfigError(TrainerError):
    """A partial, contradictory or malformed configuration: one line naming the variable and path."""

    exit_code = ExitCode.CONFIG

    def __init__(self, source: str, problem: str, path: str | None = None) -> None:
        self.source = source
        self.path = path
        self.problem = problem
        where = f"{source}: {path}" if path else source
        super().__init__(f"{where}: {problem}")


class UserCodeError(TrainerError):
    """The user's module or script failed."""

    exit_code = ExitCode.USER_CODE


class RetryableError(TrainerError):
    """Something outside the user's control failed (peer missing, timeout, preemption)."""

    def __init__(self, message: str, exit_code: int = ExitCode.PEER_TIMEOUT) -> None:
        super().__init__(message)
        self.exit_code = exit_code
