"""YAML without a dependency: a small block-style emitter, and a loader that needs PyYAML.

PyYAML is not in the images' locks, so ``dump`` writes YAML itself: block mappings and sequences,
every string double-quoted with JSON escapes (valid YAML), numbers and booleans plain.
"""

from __future__ import annotations

import importlib
import json
import re
from typing import Any

from entrypoint.errors import ConfigError

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        return _quote(value)
    raise TypeError(f"cannot write {type(value).__name__} as YAML")


def _quote(text: str) -> str:
    """A double-quoted scalar: JSON's escapes, plus YAML's for characters it will not take raw."""
    quoted = json.dumps(text, ensure_ascii=False)
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"
                   for c in quoted)


def _key(key: str) -> str:
    reserved = ("true", "false", "null", "yes", "no", "on", "off", "y", "n", "~")
    return key if _PLAIN_KEY.fullmatch(key) and key.lower() not in reserved else _quote(key)


def _lines(value: Any, indent: int) -> list[str]:
    """``value`` as block lines at ``indent`` spaces (a scalar or an empty collection is one flow line)."""
    pad = " " * indent
    if isinstance(value, dict) and value:
        out = []
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                out.append(f"{pad}{_key(key)}:")
                out += _lines(item, indent + 2 if isinstance(item, dict) else indent)
            else:
                out.append(f"{pad}{_key(key)}: {_flow(item)}")
        return out
    if isinstance(value, list) and value:
        out = []
        for item in value:
            inner = _lines(item, indent + 2)
            out.append(f"{pad}- {inner[0].lstrip()}")
            out += inner[1:]
        return out
    return [pad + _flow(value)]


def _flow(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def dump(value: Any) -> str:
    """A document for a dict (or list) of dicts, lists, strings, numbers, booleans and None."""
    return "\n".join(_lines(value, 0)) + "\n"


def load(text: str, source: str) -> Any:
    """Parse YAML with PyYAML (safe loader); a one-line error when PyYAML is not installed."""
    try:
        yaml: Any = importlib.import_module("yaml")  # PyYAML, where installed (not in the images)
    except ImportError:
        raise ConfigError(source, "is not JSON, and reading YAML needs PyYAML: convert it to JSON "
                          "(job vertex --format json) or pip install PyYAML") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(source, f"is neither JSON nor valid YAML{where}") from None
