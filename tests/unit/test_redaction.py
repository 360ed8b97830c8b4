"""Secret values in every form the user's code may spell them: hidden in records, tracebacks and log lines."""

from __future__ import annotations

import json
import logging

import pytest

from entrypoint import failures
from entrypoint.outputs import logs, redaction

SECRET = 's3cr3t"va\\lue'  # s3cr3t"va\lue: both escapes repr() and JSON make


def spelled(value: str) -> dict[str, str]:
    """The ways a value reaches text: raw, repr, in a dict's repr, JSON, the JSON of a repr, ascii."""
    return {"raw": value, "repr": repr(value), "dict repr": repr({"token": value}), "json": json.dumps(value),
            "json of repr": json.dumps(repr(value)), "json of dict repr": json.dumps(repr({"t": value})),
            "ascii": ascii(value + "é"), "single-quoted": "'" + value.replace("\\", "\\\\").replace("'", "\\'")}


@pytest.mark.parametrize("kind", list(spelled(SECRET)))
def test_every_form_of_a_secret_is_hidden(kind: str) -> None:
    text = f"tracker said no: {spelled(SECRET)[kind]} (retrying)"
    hidden = redaction.hide(text, {SECRET})
    assert SECRET[:6] not in hidden, hidden
    assert hidden.startswith("tracker said no: ") and hidden.endswith(" (retrying)") and "***" in hidden


def test_a_hidden_json_line_stays_json() -> None:
    line = json.dumps({"message": f"token={SECRET!r}", "labels": {"k": SECRET}})
    assert json.loads(redaction.hide(line, {SECRET})) == {"message": "token='***'", "labels": {"k": "***"}}


def test_plain_secrets_and_no_secrets() -> None:
    assert redaction.hide("a canary-1f2e b", {"canary-1f2e"}) == "a *** b"
    assert redaction.hide("nothing here", set()) == "nothing here"
    assert redaction.forms("abc123") == {"abc123"}


def test_failure_records_and_their_tracebacks_hide_the_repr_form() -> None:
    ctx = failures.FailureContext(replica="workerpool0-0", secrets=frozenset({SECRET}))
    try:
        raise RuntimeError(f"tracker said no: {SECRET!r} {dict(token=SECRET)}")
    except RuntimeError as exc:
        record = failures.make_record(ctx, failures.classify(exc))
    written = json.dumps(record.to_json())
    assert SECRET[:6] not in written and SECRET[:6] not in record.last_line()
    assert "tracker said no: '***' {'token': '***'}" in record.message


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_users_own_log_records_are_hidden_too(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                  fmt: str) -> None:
    """The handler on the root logger formats the user's records: secrets go before the line is written."""
    monkeypatch.setattr(logs._state, "identity", failures.FailureContext(secrets=frozenset({SECRET})))
    handler = logs._StdStreams()
    handler.setFormatter(logs.json_formatter() if fmt == "json" else logging.Formatter("%(levelname)s %(message)s"))
    user = logging.getLogger("user.tracker")
    user.addHandler(handler)
    try:
        user.warning("token=%r", SECRET)
        user.error("cannot reach the tracker with config %r", {"token": SECRET})
        try:
            raise ValueError(f"bad token {SECRET!r}")
        except ValueError:
            user.exception("failed")
    finally:
        user.removeHandler(handler)
    out = capsys.readouterr()
    assert SECRET[:6] not in out.out + out.err
    assert "token='***'" in out.out and "{'token': '***'}" in out.err and "bad token '***'" in out.err
