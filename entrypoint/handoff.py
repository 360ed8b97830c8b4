"""The launcher hands its workers the plan as data: a private JSON file named by TRAINER_PLAN_FILE.

The file lives in a directory only this user can read (it holds the user's arguments), under the
node's temporary directory, and is removed when the launcher is done. Workers never re-read the
platform's variables: they load this plan and place themselves in it by local rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from entrypoint import envvars as ev
from entrypoint.environments.settings import read_handoff
from entrypoint.errors import ConfigError
from entrypoint.plan import Plan

PLAN_FILE = "plan.json"


@contextlib.contextmanager
def plan_file(plan: Plan) -> Iterator[dict[str, str]]:
    """Write the plan to a private file for the duration of the block; yield the variables naming it."""
    directory = Path(tempfile.mkdtemp(prefix="trainer-plan-"))  # mode 0700
    path = directory / PLAN_FILE
    try:
        data: dict[str, Any] = {"plan": plan.to_dict(), "launcher_pid": os.getpid()}
        path.write_text(json.dumps(data))
        path.chmod(0o600)
        yield {ev.TRAINER_PLAN_FILE: str(path)}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def load() -> tuple[Plan, int | None]:
    """This worker's plan, placed at its local rank, and its launcher's pid."""
    handoff = read_handoff()
    if handoff.plan_file is None:
        raise ConfigError(ev.TRAINER_PLAN_FILE, "missing: a worker is started by the entrypoint's launcher")
    try:
        data = json.loads(Path(handoff.plan_file).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(ev.TRAINER_PLAN_FILE, f"cannot read the plan ({type(exc).__name__})") from None
    plan = Plan.from_dict(data["plan"]).for_process(handoff.local_rank)
    pid = data.get("launcher_pid")
    return plan, int(pid) if isinstance(pid, int) else None


def load_if_any() -> Plan | None:
    """The plan when this process was started by our launcher (or runs in-process), else None."""
    if read_handoff().plan_file is None:
        return None
    return load()[0]
