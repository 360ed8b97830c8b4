"""Log lines Cloud Logging understands: ``--log-format text|json|auto`` for the lines we write.

text: ``HH:MM:SS LEVEL message``. json: one object per line with ``severity``, ``message``, ``time``,
``logging.googleapis.com/labels`` (replica, rank, step, trial) and ``logging.googleapis.com/sourceLocation``,
which GKE's logging agent turns into the fields of the log entry (docs/operations.md). In both, records
below ERROR go to stdout and ERROR and above to stderr. The handler sits on the root logger, so the user's
own ``logging`` calls get the same format; lines we do not write (TensorFlow's C++ logging, ``warnings``,
prints) never pass through here and are left as they are. Every line written here, the user's log records
included, has the process's secret values hidden in every form (``redaction.hide``): the secret-looking
variables' values, and those the failure context knows (secret flags in the user's arguments).

auto: json on Kubernetes, except under Vertex AI / AI Platform, whose log agent keeps every line as text
(severity from the stream) even when it is JSON, and with Horovod, whose launcher prefixes its workers'
lines; text everywhere else.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import logging
import sys
import time
from typing import Any, Protocol

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments.settings import PlatformSettings, read_settings, secret_values
from entrypoint.errors import ConfigError
from entrypoint.options import LOG_FORMATS
from entrypoint.outputs import redaction

LABELS = "logging.googleapis.com/labels"
SOURCE_LOCATION = "logging.googleapis.com/sourceLocation"
_TEXT_SOURCES = ("vertex", "aiplatform")  # their agent stores a JSON line as a string (docs/operations.md)
_SEVERITIES = ((logging.CRITICAL, "CRITICAL"), (logging.ERROR, "ERROR"), (logging.WARNING, "WARNING"),
               (logging.INFO, "INFO"), (logging.DEBUG, "DEBUG"))


class Identity(Protocol):
    """Who this process is, as its failure context learns it (``failures.FailureContext``: replica, then rank, and
    the secret values no line may show)."""

    replica: str
    rank: int | None
    secrets: frozenset[str]


class _State:
    """This process's logging: the format, the installed handler and the labels that change as it runs."""

    format: str = "text"
    handler: logging.Handler | None = None
    trial: str | None = None
    step: int | None = None
    identity: Identity | None = None
    secrets: frozenset[str] = frozenset()  # the secret-looking variables' values, read at setup


_state = _State()


def secrets() -> frozenset[str]:
    """Every value this process's lines must not show."""
    who = _state.identity
    return _state.secrets | who.secrets if who is not None else _state.secrets


def json_available() -> bool:
    """Whether python-json-logger (pinned in every image) is installed."""
    return importlib.util.find_spec("pythonjsonlogger") is not None


def resolve_format(requested: str | None, settings: PlatformSettings, source: str, prefixed: bool = False) -> str:
    """``text`` or ``json``: --log-format, else $TRAINER_LOG_FORMAT, else auto for this platform (text where the
    framework's launcher prints each process's lines behind a prefix, ``prefixed``: a prefix breaks a JSON line)."""
    name = requested or settings.log_format or "auto"
    if name not in LOG_FORMATS:
        raise ConfigError(ev.TRAINER_LOG_FORMAT, f"unknown log format {name!r}; expected one of "
                          f"{', '.join(LOG_FORMATS)}")
    if name == "auto":
        json_here = settings.kubernetes and source not in _TEXT_SOURCES and not prefixed
        name = "json" if json_here and json_available() else "text"
    if name == "json" and not json_available():
        raise ConfigError("--log-format", "json needs python-json-logger (pip install python-json-logger)")
    return name


def severity(levelno: int) -> str:
    """Cloud Logging's severity name for a Python log level."""
    return next((name for level, name in _SEVERITIES if levelno >= level), "DEFAULT")


def labels() -> dict[str, str]:
    """The labels of a line written now: replica, rank (once placed), step (once training), trial (when tuning)."""
    who = _state.identity
    found = {"replica": who.replica if who else "local", "rank": who.rank if who else None, "step": _state.step,
             "trial": _state.trial}
    return {key: str(value) for key, value in found.items() if value is not None}


def identify(who: Identity) -> None:
    """Label the following lines with ``who`` (read at each line: it fills in as the process learns its rank)."""
    _state.identity = who


def note_step(step: int) -> None:
    """The training step the following lines belong to (set with each progress line)."""
    _state.step = step


def entry(levelno: int, message: str, created: float, where: tuple[str, int, str]) -> dict[str, Any]:
    """The fields GKE's agent reads from a JSON line (its special fields; the rest stays in jsonPayload)."""
    when = datetime.datetime.fromtimestamp(created, tz=datetime.timezone.utc)
    path, line, function = where
    return {"severity": severity(levelno), "message": message,
            "time": when.isoformat(timespec="microseconds").replace("+00:00", "Z"),
            LABELS: labels(), SOURCE_LOCATION: {"file": path, "line": str(line), "function": function}}


def json_formatter() -> logging.Formatter:
    """The JSON formatter (python-json-logger) with Cloud Logging's special fields."""
    from pythonjsonlogger.json import JsonFormatter

    class CloudLoggingFormatter(JsonFormatter):
        """python-json-logger with Cloud Logging's special fields first; ``extra=`` fields and tracebacks kept."""

        def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord,
                       message_dict: dict[str, Any]) -> None:
            log_data.update(entry(record.levelno, record.message, record.created,
                                  (record.pathname, record.lineno, f"{record.module}.{record.funcName}")))
            log_data["logger"] = record.name
            super().add_fields(log_data, record, message_dict)

    # Error Reporting reads a traceback from stack_trace; ensure_ascii=False keeps non-ASCII text readable.
    return CloudLoggingFormatter(rename_fields={"exc_info": "stack_trace"}, json_ensure_ascii=False)


class _StdStreams(logging.Handler):
    """stdout below ERROR, stderr from ERROR up (Vertex AI shows every stderr line as an error)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = redaction.hide(self.format(record), secrets())  # the message, its arguments, its traceback
            stream = sys.stderr if record.levelno >= logging.ERROR else sys.stdout
            stream.write(line + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def setup(fmt: str | None = None, prefix: str = "", trial: str | None = None) -> None:
    """Install the format on the root logger, once per process (``None``: the one a parent handed down)."""
    if _state.handler is not None:
        return
    settings = read_settings()
    _state.secrets = secret_values()
    _state.format = fmt or (settings.log_format if settings.log_format in ("text", "json") else "text")
    if _state.format == "json" and not json_available():
        _state.format = "text"
    _state.trial = trial or settings.trial
    handler = _StdStreams()
    handler.setFormatter(json_formatter() if _state.format == "json" else
                         logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level == logging.WARNING:  # Python's default: the user's INFO lines show, as under basicConfig(INFO)
        root.setLevel(logging.INFO)
    ours = logging.getLogger("entrypoint")
    ours.setLevel(logging.INFO)
    ours.propagate = True
    _state.handler = handler


def current_format() -> str:
    """``text`` or ``json``: what this process writes."""
    return _state.format


def to_stderr(text: str) -> None:
    """Write ``text`` and its newline to stderr in one write: processes that share stderr (a node's workers)
    never interleave inside a line (``print`` writes the newline separately when stderr is unbuffered, as with
    PYTHONUNBUFFERED=1). Secret values are hidden."""
    sys.stderr.write(redaction.hide(text, secrets()) + "\n")
    sys.stderr.flush()


def error_line(line: str) -> None:
    """Print a failure's last line on stderr: as written in text, as one ERROR object in json."""
    sys.stdout.flush()
    if _state.format == "json" and _state.handler is not None:
        caller = sys._getframe(1)
        fields = entry(logging.ERROR, line, time.time(),
                       (caller.f_code.co_filename, caller.f_lineno, caller.f_code.co_name))
        line = json.dumps({**fields, "logger": "entrypoint"}, ensure_ascii=False)
    to_stderr(line)
