"""Secret values never shown: in whatever form the user's code spells them, every line and record we write hides them.

A value reaches text raw, or escaped: ``repr()`` (quotes and backslashes escaped, either quote), ``ascii()``,
JSON (``json.dumps``, as a JSON log line or a failure record writes it), and those twice over (the JSON of a
``repr``, the ``repr`` of a dict holding a ``repr``). ``hide`` replaces each of these forms with ``***``; the
failure funnel (``failures.redact``), the log handler (``logs``) and ``local``'s prefixed output use it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import lru_cache

MASK = "***"
_DEPTH = 2  # escaped, and escaped again (JSON of a repr, a repr inside a repr)
_ESCAPES: tuple[Callable[[str], str], ...] = (
    lambda s: repr(s)[1:-1],  # Python's own choice of quotes
    lambda s: s.replace("\\", "\\\\").replace("'", "\\'"),  # inside single quotes
    lambda s: s.replace("\\", "\\\\").replace('"', '\\"'),  # inside double quotes
    lambda s: ascii(s)[1:-1],  # non-ASCII escaped too
    lambda s: json.dumps(s)[1:-1],
    lambda s: json.dumps(s, ensure_ascii=False)[1:-1],
)


def forms(secret: str) -> frozenset[str]:
    """``secret`` raw and in every escaped form (see the module's docstring)."""
    found, layer = {secret}, {secret}
    for _ in range(_DEPTH):
        layer = {escape(value) for value in layer for escape in _ESCAPES} - found
        found |= layer
    return frozenset(f for f in found if f)


@lru_cache(maxsize=32)
def _ordered(secrets: frozenset[str]) -> tuple[str, ...]:
    """Every form of every secret, longest first (a longer form is replaced before a shorter one inside it)."""
    return tuple(sorted({f for s in secrets if s for f in forms(s)}, key=len, reverse=True))


def hide(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every form of every secret value replaced by ``***``."""
    chosen = secrets if isinstance(secrets, frozenset) else frozenset(secrets)
    if not chosen:
        return text
    for form in _ordered(chosen):
        if form in text:
            text = text.replace(form, MASK)
    return text
