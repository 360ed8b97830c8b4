"""Strict readers for JSON cluster specs and integer variables, ending in one-line ConfigErrors.

Messages name the variable and the JSON path at fault and what kind of value was found there, never the
value itself: CLUSTER_SPEC can carry user arguments (its ``job`` field), which may include secrets, and
anything printed reaches logs, failure records and Kubernetes' termination message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from entrypoint.cluster.topology import PlatformRanks
from entrypoint.errors import ConfigError


def is_uint(text: str) -> bool:
    """ASCII digits only, short enough to be a sane count or index."""
    return text.isascii() and text.isdigit() and len(text) < 10


def shown(value: object) -> str:
    """What kind of JSON value ``value`` is, for an error message: never the value itself."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    return "an object" if isinstance(value, dict) else "a list"


def load_object(variable: str, raw: str) -> dict[str, Any]:
    """Parse a JSON object from an environment variable."""
    if not raw.strip():
        raise ConfigError(variable, "is set but empty")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(variable, f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise ConfigError(variable, "is not valid JSON (nested too deeply)") from None
    if not isinstance(value, dict):
        raise ConfigError(variable, f"must be a JSON object, got {type(value).__name__}")
    return value


def get_object(variable: str, obj: Mapping[str, Any], key: str, path: str) -> dict[str, Any]:
    """A required nested object."""
    if key not in obj:
        raise ConfigError(variable, "missing", path)
    value = obj[key]
    if not isinstance(value, dict):
        raise ConfigError(variable, f"must be an object, got {shown(value)}", path)
    return value


def get_index(variable: str, task: Mapping[str, Any], path: str) -> int:
    """task.index: a non-negative integer (a digit string is tolerated)."""
    if "index" not in task:
        return 0
    value = task["index"]
    if isinstance(value, str) and is_uint(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(variable, f"must be a non-negative integer, got {shown(value)}", path)
    if value < 0:
        raise ConfigError(variable, "must be a non-negative integer, got a negative one", path)
    return value


def get_trial(variable: str, task: Mapping[str, Any], path: str) -> str | None:
    """task.trial: the tuning trial id as a string, or None outside tuning."""
    value = task.get("trial")
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError(variable, f"must be a string, got {shown(value)}", path)
    text = str(value)
    if "/" in text or text in (".", "..") or len(text) > 64 or not text.isprintable():
        raise ConfigError(variable, "must be a short id usable as a directory name", path)
    return text


def get_addresses(variable: str, value: object, path: str) -> tuple[str, ...]:
    """A pool: a list of 'host:port' strings."""
    if not isinstance(value, list):
        raise ConfigError(variable, f"must be a list of 'host:port' strings, got {shown(value)}", path)
    out = []
    for i, item in enumerate(value):
        out.append(check_address(variable, item, f"{path}[{i}]"))
    return tuple(out)


def check_address(variable: str, item: object, path: str) -> str:
    """One 'host:port' string with a valid port."""
    if not isinstance(item, str):
        raise ConfigError(variable, f"must be a 'host:port' string, got {shown(item)}", path)
    host, sep, port = item.rpartition(":")
    if not sep or not host or not host.strip() or any(c.isspace() for c in item):
        raise ConfigError(variable, "must be 'host:port' (a host name or address, a colon, a port)", path)
    if not is_uint(port) or not 0 < int(port) < 65536:
        raise ConfigError(variable, "has an invalid port (1-65535 after the last colon)", path)
    return item


def get_int(environ: Mapping[str, str], name: str, *, minimum: int = 0) -> int | None:
    """An optional integer variable; None when unset."""
    raw = environ.get(name)
    if raw is None:
        return None
    text = raw.strip()
    if not is_uint(text):
        raise ConfigError(name, f"must be an integer >= {minimum}")
    value = int(text)
    if value < minimum:
        raise ConfigError(name, f"must be an integer >= {minimum}")
    return value


def require_int(environ: Mapping[str, str], name: str, because: str, *, minimum: int = 0) -> int:
    """A required integer variable."""
    value = get_int(environ, name, minimum=minimum)
    if value is None:
        raise ConfigError(name, f"missing ({because})")
    return value


def host_port(environ: Mapping[str, str], addr_var: str, port_var: str, because: str) -> str:
    """MASTER_ADDR + MASTER_PORT (or their PET_ twins) as one 'host:port' string."""
    host = environ.get(addr_var, "").strip()
    if not host:
        raise ConfigError(addr_var, f"missing ({because})")
    if any(c.isspace() for c in host) or len(host) > 253:
        raise ConfigError(addr_var, "is not a host name or address (it has spaces or is too long)")
    port = require_int(environ, port_var, because, minimum=1)
    if port > 65535:
        raise ConfigError(port_var, "must be a port number (1-65535)")
    return f"{host}:{port}"


@dataclass(frozen=True)
class ProcessVariables:
    """The names one launcher family gives a process's ranks (torchrun's, Open MPI's, Horovod's...)."""

    rank: str
    size: str
    local_rank: str
    local_size: str
    node_rank: str
    nodes: str


def process_ranks(environ: Mapping[str, str], names: ProcessVariables, because: str,
                  local_rank_required: bool = False) -> tuple[PlatformRanks, int, int]:
    """A platform-placed process's ranks, its node rank and the node count, checked against each other."""
    rank = require_int(environ, names.rank, because)
    size = require_int(environ, names.size, because, minimum=1)
    local_rank = (require_int(environ, names.local_rank, because) if local_rank_required
                  else get_int(environ, names.local_rank) or 0)
    local_size = get_int(environ, names.local_size, minimum=1) or 1
    if rank >= size:
        raise ConfigError(names.rank, f"is out of range: it must be below {names.size}")
    if local_rank >= local_size:
        raise ConfigError(names.local_rank, f"is out of range: it must be below {names.local_size}")
    if local_size > size:
        raise ConfigError(names.local_size, f"is larger than {names.size}")
    node_rank = get_int(environ, names.node_rank)
    if node_rank is None:
        node_rank = rank // local_size
    nodes = get_int(environ, names.nodes, minimum=1) or -(-size // local_size)
    if node_rank >= nodes:
        raise ConfigError(names.node_rank, f"is out of range: it must be below {names.nodes} (the node count)")
    return PlatformRanks(rank, size, local_rank, local_size), node_rank, nodes
