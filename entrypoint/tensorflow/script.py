"""Script mode: run a training script or ``python -m`` module unchanged, in this process."""

from __future__ import annotations

import logging
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

from entrypoint.errors import ExitCode
from entrypoint.usercode import module_source

log = logging.getLogger("entrypoint.tensorflow")


def _exit_code(exc: SystemExit) -> int:
    """``sys.exit(x)`` as the shell would see it: None/0 success, an int itself, anything else 1."""
    if exc.code is None:
        return ExitCode.OK
    return exc.code if isinstance(exc.code, int) else ExitCode.USER_CODE


def run_script(kind: str, target: str, user_args: Sequence[str]) -> int:
    """Run ``target`` as ``__main__`` with ``sys.argv = [target, *user_args]``, as ``python`` would."""
    argv0 = str(Path(target).resolve()) if kind == "script" else str(module_source(target))
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [argv0, *user_args]
    if kind == "script":
        sys.path.insert(0, str(Path(argv0).parent))  # as `python script.py` does
    log.info("running %s %s unchanged", kind, target)
    try:
        if kind == "script":
            runpy.run_path(argv0, run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return _exit_code(exc)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return ExitCode.OK
