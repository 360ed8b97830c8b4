"""Failures: each classified once (``classify.py``), recorded (``records.py``), ended in one way (``finish.py``).

The names below are the package's interface: ``failures.classify(exc)``, ``failures.guarded(body, ctx)``,
``failures.finish(ctx, record)``, ``failures.FailureContext``.
"""

from entrypoint.failures.classify import (
    Failure,
    PeerSigns,
    add_peer_source,
    classify,
    code_class,
    exit_failure,
    first_cause,
    is_peer_lost,
)
from entrypoint.failures.finish import (
    FailureContext,
    attempts_alike,
    finish,
    finish_child,
    finish_node,
    guarded,
    make_record,
    record_verdict,
    redact,
    write_record,
)
from entrypoint.failures.records import LAST_LINE_CHARS, clip, error_line

__all__ = [
    "LAST_LINE_CHARS",
    "Failure",
    "FailureContext",
    "PeerSigns",
    "add_peer_source",
    "attempts_alike",
    "classify",
    "clip",
    "code_class",
    "error_line",
    "exit_failure",
    "finish",
    "finish_child",
    "finish_node",
    "first_cause",
    "guarded",
    "is_peer_lost",
    "make_record",
    "record_verdict",
    "redact",
    "write_record",
]
