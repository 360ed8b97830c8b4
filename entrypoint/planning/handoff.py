"""The launcher hands its workers the plan as data, in memory: nothing of it is ever on a disk.

The plan holds the user's arguments (tokens included), so it never goes to a file a crash could leave
behind: the launcher writes it into an anonymous memory file (``memfd_create``, mode 0600, sealed
read-only) that lives exactly as long as the launcher holds it, and names it to its children as
``TRAINER_PLAN_FILE=/proc/<launcher pid>/fd/<n>``. A child of the same user opens that link (the
kernel lets only processes that may inspect the launcher do so); when the launcher ends, SIGKILL
included, the kernel frees the memory. Workers never re-read the platform's variables: they load
this plan and place themselves in it by local rank.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments.settings import Handoff, read_handoff
from entrypoint.errors import ConfigError
from entrypoint.planning import registry
from entrypoint.planning.plan import Plan

_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


@contextlib.contextmanager
def plan_file(plan: Plan) -> Iterator[dict[str, str]]:
    """Hold the plan in a sealed memory file for the duration of the block; yield the variables naming it."""
    data: dict[str, Any] = {"plan": plan.to_dict(), "launcher_pid": os.getpid()}
    payload = json.dumps(data).encode()
    fd = os.memfd_create("trainer-plan", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        yield {ev.TRAINER_PLAN_FILE: f"/proc/{os.getpid()}/fd/{fd}"}
    finally:
        os.close(fd)


def read(environ: Mapping[str, str] | None = None) -> Handoff:
    """What this worker's launcher handed it; its local rank in the variable its framework's launcher sets."""
    return read_handoff(registry.local_rank_variables(), environ)


def launcher_of(handoff: Handoff) -> int | None:
    """The pid of the launcher that handed this worker its plan, read from the plan file's name alone
    (``/proc/<pid>/fd/<n>``): known before the plan is read, so a worker can bind its life to that launcher's
    first (``signals.die_with_parent``); None for any other name."""
    found = re.fullmatch(r"/proc/(\d+)/fd/\d+", handoff.plan_file or "")
    return int(found.group(1)) if found else None


def parent_of_worker(launcher: int | None) -> int | None:
    """The parent a worker started by ``launcher`` dies with: the launcher, or the process the launcher started that
    forked this worker (a node's fork server, ``pytorch/launch/forkserver.py``, itself bound to the launcher)."""
    parent = os.getppid()
    if launcher is None or parent == launcher:
        return launcher
    try:
        grandparent = int(Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return launcher
    return parent if grandparent == launcher else launcher


def load(handoff: Handoff) -> tuple[Plan, int | None]:
    """This worker's plan, placed at its local rank, and its launcher's pid (read once per process)."""
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
    handed = read()
    if handed.plan_file is None:
        return None
    return load(handed)[0]
