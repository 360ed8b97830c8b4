"""The vulnerability gate's version orders (vuln_gate.py): an advisory's range is read in its ecosystem's order.

PyPI versions are ordered as PEP 440 says (the rules of ``packaging.version``), Debian's and Ubuntu's as dpkg orders
them (lib/dpkg/version.c); OSV's ``"0"`` ("from the first version") is below every version. Standard library only
(Python >= 3.11): it runs in the images themselves.
"""

from __future__ import annotations

import re
from typing import Any

_PEP440 = re.compile(
    r"v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>\d+)?)?"
    r"(?:-(?P<post_n1>\d+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>\d+)?)?"
    r"(?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d+)?)?"
    r"(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?", re.IGNORECASE)
_PRE = {"alpha": "a", "a": "a", "beta": "b", "b": "b", "c": "rc", "pre": "rc", "preview": "rc", "rc": "rc"}
_LOW, _HIGH = (0,), (2,)  # below and above every value: PEP 440's "no pre-release", "no post-release"...


def pep440_key(version: str) -> tuple[Any, ...]:
    """A sort key ordering versions as PEP 440 does (the rules of ``packaging.version``); ValueError otherwise."""
    m = _PEP440.fullmatch(version.strip().lower())
    if m is None:
        raise ValueError(f"not a PEP 440 version: {version!r}")
    release = tuple(int(p) for p in m["release"].split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    post_n = m["post_n1"] or m["post_n2"]
    has_post = m["post_l"] is not None or m["post_n1"] is not None
    if m["pre_l"] is None and not has_post and m["dev_l"] is not None:
        pre: tuple[Any, ...] = (-1,)  # 1.0.dev0 sorts before 1.0a0
    elif m["pre_l"] is None:
        pre = _HIGH
    else:
        pre = (1, _PRE[m["pre_l"]], int(m["pre_n"] or 0))
    post = (1, int(post_n or 0)) if has_post else _LOW
    dev = (1, int(m["dev_n"] or 0)) if m["dev_l"] is not None else _HIGH
    local = tuple((1, int(p), "") if p.isdigit() else (0, 0, p) for p in re.split(r"[-_.]", m["local"])) \
        if m["local"] else ()
    return int(m["epoch"] or 0), release, pre, post, dev, local


def _order(c: str) -> int:
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    return -1 if c == "~" else ord(c) + 256


def _verrevcmp(a: str, b: str) -> int:
    """dpkg's comparison of one part of a version (lib/dpkg/version.c, verrevcmp)."""
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) else 0
            bc = _order(b[j]) if j < len(b) else 0
            if ac != bc:
                return ac - bc
            i, j = i + 1, j + 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and j < len(b) and a[i].isdigit() and b[j].isdigit():
            first_diff = first_diff or ord(a[i]) - ord(b[j])
            i, j = i + 1, j + 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


def dpkg_compare(a: str, b: str) -> int:
    """< 0, 0, > 0 as dpkg orders Debian versions ``[epoch:]upstream[-revision]``."""
    def split(v: str) -> tuple[int, str, str]:
        epoch, colon, rest = v.partition(":")
        if not colon:
            epoch, rest = "0", v
        upstream, dash, revision = rest.rpartition("-")
        return int(epoch or 0), (upstream if dash else rest), (revision if dash else "")
    (ea, ua, ra), (eb, ub, rb) = split(a), split(b)
    return (ea > eb) - (ea < eb) or _verrevcmp(ua, ub) or _verrevcmp(ra, rb)


def compare(ecosystem: str, a: str, b: str) -> int:
    """< 0, 0, > 0: ``a`` against ``b`` in the ecosystem's order ("0", OSV's "from the first version", is lowest)."""
    if a == b:
        return 0
    if a == "0" or b == "0":
        return -1 if a == "0" else 1
    if ecosystem == "PyPI":
        ka, kb = pep440_key(a), pep440_key(b)
        return (ka > kb) - (ka < kb)
    return dpkg_compare(a, b)
