"""A malformed ``--module`` is one ConfigError line (exit 2), not importlib's RecursionError classed user_code."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from entrypoint.errors import ConfigError
from entrypoint.planning.usercode import MAX_MODULE_PARTS, find_code
from tests.conftest import PYTHON, ROOT, subprocess_env

DEEP = ".".join(["a"] * 2000)


@pytest.mark.parametrize(("name", "what"), [
    (DEEP, f"a module name of 2000 dotted parts (at most {MAX_MODULE_PARTS})"),
    (".".join(["a"] * (MAX_MODULE_PARTS + 1)), f"of {MAX_MODULE_PARTS + 1} dotted parts"),
    ("pkg..module", "'pkg..module' has an empty part"),
    (".module", "'.module' has an empty part"),
], ids=["2000 parts", "one part too many", "empty part", "relative"])
def test_a_malformed_module_name_is_a_config_error(name: str, what: str) -> None:
    with pytest.raises(ConfigError) as info:
        find_code(name, None)
    assert str(info.value).startswith("--module: ") and what in str(info.value)


def test_a_module_name_at_the_limit_is_looked_up() -> None:
    with pytest.raises(ConfigError, match="cannot find module"):
        find_code(".".join(["a"] * MAX_MODULE_PARTS), None)


def test_a_2000_part_module_ends_run_with_one_config_line(tmp_path: Path) -> None:
    proc = subprocess.run([PYTHON, "-m", "entrypoint", "run", "--framework", "pytorch", "--job-dir",
                           str(tmp_path / "job"), "--module", DEEP], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "RecursionError" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("entrypoint: error: config ") and "dotted parts" in last, last
