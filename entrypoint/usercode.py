"""User code: tell a hooks module from a script without importing it, load hooks, parse user args."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from entrypoint import envvars as ev
from entrypoint.errors import ConfigError
from entrypoint.options import RunOptions

REQUIRED_HOOKS = ("build_model", "build_datasets")


def module_source(name: str) -> Path:
    """The source file of module ``name`` (found, not imported)."""
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


def require_code(options: RunOptions, default_module: str | None) -> tuple[str, str]:
    """('module', name) or ('script', path): --module, --script, else $TRAINER_MODULE."""
    if options.script:
        if not Path(options.script).is_file():
            raise ConfigError("--script", f"{options.script} does not exist")
        return "script", options.script
    name = options.module or default_module
    if not name:
        raise ConfigError("--module", f"no user code: pass --module MOD or --script FILE (or set {ev.TRAINER_MODULE})")
    module_source(name)
    return "module", name


def load_hooks(name: str) -> ModuleType:
    """Import a hooks module and check it defines the required hooks."""
    module = importlib.import_module(name)
    missing = [hook for hook in REQUIRED_HOOKS if not callable(getattr(module, hook, None))]
    if missing:
        raise ConfigError("--module", f"{name!r} lacks the hooks {', '.join(missing)}")
    return module


def parse_user_args(module: ModuleType, user_args: Sequence[str]) -> argparse.Namespace:
    """The module's own arguments (its ``add_arguments(parser)`` hook) from what followed ``--``."""
    parser = argparse.ArgumentParser(prog=f"{module.__name__} (after --)", add_help=True)
    add_arguments = getattr(module, "add_arguments", None)
    if callable(add_arguments):
        add_arguments(parser)
    try:
        return parser.parse_args(list(user_args))
    except SystemExit as exc:
        if exc.code == 0:
            raise
        raise ConfigError("user arguments", f"{module.__name__} rejected {' '.join(user_args)!r}") from None


def module_default(module: ModuleType, key: str, fallback: Any) -> Any:
    """A value from the module's ``DEFAULTS`` dict, else ``fallback``."""
    defaults = getattr(module, "DEFAULTS", {}) or {}
    return defaults.get(key, fallback)
