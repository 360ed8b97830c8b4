"""User code: find it (hooks module, module, or script) without importing it; load hooks; run scripts.

A module is in hooks mode when it binds ``build_model`` at top level (read with ``ast``, never imported).
Scripts and plain modules run unchanged in the calling process, as ``python`` would run them.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import logging
import runpy
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from entrypoint.errors import ConfigError, ExitCode, sys_exit_code

REQUIRED_HOOKS = ("build_model", "build_datasets")
log = logging.getLogger("entrypoint")


@dataclass(frozen=True)
class UserCode:
    """The user's code: a hooks module (our loop), a module run as ``python -m``, or a script file."""

    kind: Literal["hooks", "module", "script"]
    target: str


MAX_MODULE_PARTS = 64  # deeper than any real package; importlib recurses per part, and 2000 parts overflow its stack


def check_module_name(name: str) -> None:
    """A dotted name of at most ``MAX_MODULE_PARTS`` non-empty parts, else a ConfigError.

    A part need not be an identifier: ``python -m my-module`` runs ``my-module.py``, and so does ``--module``.
    """
    parts = name.split(".")
    if len(parts) > MAX_MODULE_PARTS:
        raise ConfigError("--module", f"a module name of {len(parts)} dotted parts (at most {MAX_MODULE_PARTS})")
    if not all(parts):
        raise ConfigError("--module", f"{name!r} has an empty part (a module name is dotted names: pkg.module)")


def module_source(name: str) -> Path:
    """The source file of module ``name`` (found, not imported)."""
    check_module_name(name)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        raise ConfigError("--module", f"cannot find module {name!r} ({exc})") from None
    if spec is None:
        raise ConfigError("--module", f"cannot find module {name!r} (is it on PYTHONPATH / installed?)")
    if spec.submodule_search_locations:  # a package: python -m runs its __main__
        main = importlib.util.find_spec(f"{name}.__main__")
        if main is None or main.origin is None:
            raise ConfigError("--module", f"{name!r} is a package without __main__")
        return Path(main.origin)
    if spec.origin is None or not spec.origin.endswith(".py"):
        raise ConfigError("--module", f"{name!r} has no Python source to run")
    return Path(spec.origin)


def is_hooks_module(name: str) -> bool:
    """True when the module binds ``build_model`` at top level (hooks mode); read with ast, never imported."""
    try:
        tree = ast.parse(module_source(name).read_text(encoding="utf-8"))
    except SyntaxError as exc:
        raise ConfigError("--module", f"{name!r} does not parse: line {exc.lineno}: {exc.msg}") from None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "build_model":
            return True
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == "build_model" for a in node.names):
            return True
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "build_model" for t in targets):
            return True
    return False


def find_code(module: str | None, script: str | None) -> UserCode | None:
    """--script (must exist), else --module / $TRAINER_MODULE (hooks or plain), else None."""
    if script:
        if Path(script).is_dir():
            raise ConfigError("--script", f"{script} is a directory, not a Python file (name the file to run, or "
                              "use --module for a package)")
        if not Path(script).is_file():
            raise ConfigError("--script", f"{script} does not exist")
        return UserCode("script", script)
    if not module:
        return None
    return UserCode("hooks" if is_hooks_module(module) else "module", module)


def load_hooks(name: str) -> ModuleType:
    """Import a hooks module and check it defines the required hooks."""
    module = importlib.import_module(name)
    missing = [hook for hook in REQUIRED_HOOKS if not callable(getattr(module, hook, None))]
    if missing:
        raise ConfigError("--module", f"{name!r} lacks the hooks {', '.join(missing)}")
    return module


class _ArgumentError(Exception):
    """argparse's complaint about the user's arguments, kept instead of exiting."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print usage and exit 2
        raise _ArgumentError(message)


def parse_user_args(module: ModuleType, user_args: Sequence[str]) -> argparse.Namespace:
    """The module's own arguments (its ``add_arguments(parser)`` hook) from what followed ``--``.

    A rejected argument is named by its flag only: its value may be a secret.
    """
    parser = _Parser(prog=f"{module.__name__} (after --)", add_help=True)
    add_arguments = getattr(module, "add_arguments", None)
    if callable(add_arguments):
        add_arguments(parser)
    try:
        return parser.parse_args(list(user_args))
    except _ArgumentError as exc:
        raise ConfigError("user arguments", f"{module.__name__} rejected {_flags_only(str(exc), user_args)}") from None


def _flags_only(message: str, user_args: Sequence[str]) -> str:
    """argparse's complaint reduced to the flags it names (``argument --lr``, ``unrecognized --foo``)."""
    flags = [a.split("=", 1)[0] for a in user_args if a.startswith("-")]
    named = [f for f in flags if f in message]
    if message.startswith("argument ") and ":" in message:
        return f"{message.split(':', 1)[0]} (an invalid value)"
    if "unrecognized arguments" in message:
        return "unrecognized arguments " + (" ".join(named) if named else "(values not shown)")
    return message.split(":", 1)[0] + (f" ({' '.join(named)})" if named else "")


def module_default(module: ModuleType, key: str, fallback: Any) -> Any:
    """A value from the module's ``DEFAULTS`` dict, else ``fallback``."""
    defaults = getattr(module, "DEFAULTS", {}) or {}
    return defaults.get(key, fallback)


def run_script(code: UserCode, user_args: Sequence[str]) -> int:
    """Run a script or ``python -m`` module as ``__main__`` with ``sys.argv = [target, *user_args]``."""
    argv0 = str(Path(code.target).resolve()) if code.kind == "script" else str(module_source(code.target))
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [argv0, *user_args]
    if code.kind == "script":
        sys.path.insert(0, str(Path(argv0).parent))  # as `python script.py` does
    log.info("running %s %s unchanged", code.kind, code.target)
    try:
        if code.kind == "script":
            runpy.run_path(argv0, run_name="__main__")
        else:
            runpy.run_module(code.target, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return sys_exit_code(exc)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return ExitCode.OK
