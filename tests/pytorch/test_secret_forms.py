"""A secret-looking variable's value appears in no output form, however the user's code spells it (issue 33).

The user's code raises an exception whose message holds ``repr()`` of the value (quotes and backslashes escaped)
and of a dict holding it, and logs them through ``logging``. Neither stdout, stderr nor the failure records under
``<job dir>/failures/`` hold the raw value, its repr, its JSON-escaped form or the repr's JSON-escaped form.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runs import entrypoint, failure_text

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
SECRET = 's3cr3t"va\\lue'  # s3cr3t"va\lue


def forms(value: str) -> dict[str, str]:
    return {"raw": value, "repr": repr(value)[1:-1], "json": json.dumps(value)[1:-1],
            "json of repr": json.dumps(repr(value))[1:-1], "distinctive part": value[:6]}


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_secret_in_repr_form_appears_in_no_output(tmp_path: Path, log_format: str) -> None:
    proc = entrypoint("run", "--framework", "pytorch", "--job-dir", str(tmp_path), "--module",
                      "tests.pytorch.raising_hooks", "--epochs", "1", "--log-format", log_format,
                      "--", "--message", "tracker said no:", "--log-secret", "MY_API_TOKEN",
                      env={"MY_API_TOKEN": SECRET})
    assert proc.returncode == 1, failure_text(proc)
    assert "RuntimeError" in proc.stderr and "tracker" in proc.stderr  # the user's failure and log line were shown
    records = "\n".join(p.read_text() for p in sorted(tmp_path.rglob("failures/*.json")))
    places = {"stdout": proc.stdout, "stderr": proc.stderr, "failure records": records}
    assert places["failure records"], "no failure record written"
    leaks = [f"{kind} in {where}" for where, text in places.items() for kind, form in forms(SECRET).items()
             if form in text]
    shown = [line for text in places.values() for line in text.splitlines() if SECRET[:6] in line][:6]
    assert not leaks, f"the secret leaked: {leaks}\n" + "\n".join(shown)
    assert "token=***" in proc.stdout + proc.stderr or "token='***'" in proc.stdout + proc.stderr
