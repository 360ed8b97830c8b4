"""TRAINER_FORK_SERVER: a node's ranks forked from its fork server (default) or exec'd (off); anything else is one
configuration error naming the variable, never its value (the CLI prints a ConfigError of read_settings in one line
before anything starts: tests/unit/test_restart_count.py)."""

from __future__ import annotations

import pytest

from entrypoint.cluster.environments.settings import read_settings
from entrypoint.errors import ConfigError


@pytest.mark.parametrize(("value", "on"), [(None, True), ("", True), ("1", True), ("true", True), ("ON", True),
                                           ("yes", True), ("0", False), ("false", False), ("Off", False),
                                           ("no", False), (" 0 ", False)])
def test_the_switch_is_on_unless_turned_off(value: str | None, on: bool) -> None:
    env = {} if value is None else {"TRAINER_FORK_SERVER": value}
    assert read_settings(env).fork_server is on


@pytest.mark.parametrize("value", ["2", "disable", "o n"])
def test_a_bad_switch_is_one_config_error_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        read_settings({"TRAINER_FORK_SERVER": value})
    message = str(info.value)
    assert message.startswith("TRAINER_FORK_SERVER: ") and "\n" not in message and value not in message

