"""--log-format: which format each platform gets, and what one JSON line carries (Cloud Logging's special fields)."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from entrypoint import failures
from entrypoint.cluster.environments.settings import read_settings
from entrypoint.errors import ConfigError
from entrypoint.outputs import logs
from entrypoint.planning import registry


@pytest.mark.parametrize(("requested", "env", "source", "expected"), [
    (None, {}, "local", "text"),
    (None, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "kubeflow", "json"),
    (None, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "tf_config", "json"),
    (None, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "vertex", "text"),  # Vertex's agent keeps JSON lines as text
    (None, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "aiplatform", "text"),
    ("json", {}, "vertex", "json"),
    ("text", {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "kubeflow", "text"),
    (None, {"TRAINER_LOG_FORMAT": "json"}, "local", "json"),
    ("text", {"TRAINER_LOG_FORMAT": "json"}, "local", "text"),  # the flag wins
    (None, {"TRAINER_LOG_FORMAT": "auto", "KUBERNETES_SERVICE_HOST": "h"}, "torch", "json"),
])
def test_format_per_platform(monkeypatch: pytest.MonkeyPatch, requested: str | None, env: dict[str, str],
                             source: str, expected: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert logs.resolve_format(requested, read_settings(), source) == expected


def test_auto_is_text_for_horovod_whose_launcher_prefixes_worker_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    prefixed = registry.get("horovod").prefixed_output
    assert logs.resolve_format(None, read_settings(), "kubeflow", prefixed) == "text"
    assert logs.resolve_format("json", read_settings(), "kubeflow", prefixed) == "json"


def test_an_unknown_format_in_the_environment_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINER_LOG_FORMAT", "yaml")
    with pytest.raises(ConfigError, match="TRAINER_LOG_FORMAT: unknown log format 'yaml'"):
        logs.resolve_format(None, read_settings(), "local")


def test_severity_names() -> None:
    assert [logs.severity(level) for level in (5, 10, 20, 25, 30, 40, 50, 60)] == [
        "DEFAULT", "DEBUG", "INFO", "INFO", "WARNING", "ERROR", "CRITICAL", "CRITICAL"]


@pytest.fixture
def placed(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as rank 3 of replica workerpool1-0 in trial 7, at step 120."""
    monkeypatch.setattr(logs._state, "identity", failures.FailureContext(replica="workerpool1-0", rank=3))
    monkeypatch.setattr(logs._state, "trial", "7")
    monkeypatch.setattr(logs._state, "step", 120)


def record(level: int, msg: str, *args: object, **extra: object) -> logging.LogRecord:
    made = logging.getLogger("user.code").makeRecord("user.code", level, "/app/train.py", 42, msg, args, None,
                                                     func="fit", extra=extra or None)
    return made


@pytest.mark.usefixtures("placed")
def test_a_json_line_carries_cloud_loggings_special_fields() -> None:
    line = logs.json_formatter().format(record(logging.WARNING, "loss is %s", "nan", epoch=3))
    assert "\n" not in line
    data = json.loads(line)
    assert data["severity"] == "WARNING" and data["message"] == "loss is nan"
    assert data["time"].endswith("Z") and "T" in data["time"]
    assert data[logs.LABELS] == {"replica": "workerpool1-0", "rank": "3", "step": "120", "trial": "7"}
    assert data[logs.SOURCE_LOCATION] == {"file": "/app/train.py", "line": "42", "function": "train.fit"}
    assert data["logger"] == "user.code" and data["epoch"] == 3  # extra= fields stay in jsonPayload
    assert list(data)[:2] == ["severity", "message"]


@pytest.mark.usefixtures("placed")
def test_a_logged_exception_is_one_line_with_its_stack_trace() -> None:
    try:
        raise ValueError("bad batch")
    except ValueError:
        made = record(logging.ERROR, "step failed")
        made.exc_info = sys.exc_info()
    data = json.loads(logs.json_formatter().format(made))
    assert data["severity"] == "ERROR" and "ValueError: bad batch" in data["stack_trace"]


def test_the_last_line_is_text_or_one_error_object(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(logs._state, "identity", failures.FailureContext(replica="chief-0", rank=0))
    line = "entrypoint: error: user_code on chief-0, rank 0, host h: ValueError: x (exit 1, permanent)"
    monkeypatch.setattr(logs._state, "format", "text")
    logs.error_line(line)
    assert capsys.readouterr() == ("", line + "\n")
    monkeypatch.setattr(logs._state, "format", "json")
    monkeypatch.setattr(logs._state, "handler", logging.NullHandler())
    logs.error_line(line)
    out, err = capsys.readouterr()
    data = json.loads(err)
    assert out == "" and data["severity"] == "ERROR" and data["message"] == line
    assert data[logs.LABELS]["replica"] == "chief-0"
