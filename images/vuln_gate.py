#!/usr/bin/env python3
"""The vulnerability gate: an image's bill of materials against an OSV advisory database, with an expiring allowlist.

A build fails on a known, fixable, high or critical finding that the allowlist does not name, and on any allowlist
entry whose expiry date has come (docs/images.md, "Vulnerability gate"):

- what is installed: the image's CycloneDX document (``python -m entrypoint sbom write``: dpkg's packages with their
  source packages, the venv's Python distributions);
- what is known: OSV records (https://ossf.github.io/osv-schema/), the format osv.dev exports per ecosystem
  (``gs://osv-vulnerabilities/<ecosystem>/all.zip``: PyPI, Ubuntu, Debian), given as zips, directories or files of JSON.
  Nothing is downloaded here: Cloud Build fetches the exports in a step of its own; the tests give a small fixture;
- a finding: a package whose version an advisory's ``affected`` entry covers (its ECOSYSTEM ranges or its
  ``versions`` list; PyPI versions compared as PEP 440, Debian and Ubuntu ones as dpkg does). Its severity is the
  highest of the record's own labels (GitHub's ``database_specific.severity``, Ubuntu's priority, Debian's urgency)
  and its CVSS v3 vectors' base scores; it is fixable when the range it falls in ends in a ``fixed`` version;
- the allowlist (TOML, ``[[ignore]]`` entries): ``id`` (the advisory's id or an alias: CVE-..., GHSA-..., PYSEC-...,
  UBUNTU-CVE-...), ``reason``, ``expires`` (a date), and optionally ``package`` and ``images``. An entry without a
  reason or an expiry date is refused; one whose date has come fails the gate, whether or not it still matches.

    python3 images/vuln_gate.py --sbom FILE --allowlist images/vulnerability-allowlist.toml [--osv PATH]...
                                [--image NAME] [--report FILE] [--today YYYY-MM-DD]

Exit 0: passed; 1: a failing finding or an expired entry (one line each, then one line saying what to do); 2: an
input that cannot be read (one line). Standard library only (Python >= 3.11): it runs in the images themselves and
in images/local_build.py.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import re
import sys
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import tomllib

LEVELS = {"negligible": 0, "unimportant": 0, "low": 1, "medium": 2, "moderate": 2, "high": 3, "critical": 4}
NAMES = {0: "negligible", 1: "low", 2: "medium", 3: "high", 4: "critical"}
FAILING = 3  # high and critical
ENTRY_KEYS = {"id", "reason", "expires", "package", "images"}
ALLOWLIST = "images/vulnerability-allowlist.toml"


class GateError(Exception):
    """An input the gate cannot read: one line naming it."""


# ---- versions ---------------------------------------------------------------------------------

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


# ---- what is installed ------------------------------------------------------------------------

@dataclass(frozen=True)
class Package:
    """One component of the bill of materials, as advisories name it."""

    ecosystem: str  # OSV's: PyPI, Debian:12, Ubuntu:24.04:LTS
    name: str  # what advisories name: the normalized Python name, the deb's source package
    version: str  # ... and its version (a deb's source version)
    label: str  # what people read: "numpy 2.4.6", "libssl3 3.0.15-1 (source openssl)"
    names: frozenset[str] = frozenset()  # every name an allowlist entry may give for it


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def os_ecosystem(doc: dict[str, Any]) -> str:
    """OSV's ecosystem for the document's operating system: ``Debian:12``, ``Ubuntu:24.04:LTS``."""
    for c in doc.get("components", []):
        if isinstance(c, dict) and c.get("type") == "operating-system":
            name, version = str(c.get("name", "")).lower(), str(c.get("version", ""))
            if name == "debian":
                return f"Debian:{version.split('.')[0]}"
            if name == "ubuntu":
                return f"Ubuntu:{version}" + (":LTS" if "LTS" in str(c.get("description", "")) else "")
            return f"{name}:{version}"
    return ""


def _property(component: dict[str, Any], name: str) -> str:
    return next((str(p.get("value", "")) for p in component.get("properties", []) if isinstance(p, dict)
                 and p.get("name") == name), "")


def packages(doc: dict[str, Any]) -> list[Package]:
    """The document's packages as their ecosystem's advisories name them: a deb by its source package, the binaries
    built from one source version counted once (``glibc 2.36-9 (libc-bin, libc6)``)."""
    system = os_ecosystem(doc)
    out: list[Package] = []
    debs: dict[tuple[str, str], list[str]] = {}
    for c in doc.get("components", []):
        purl = str(c.get("purl", "")) if isinstance(c, dict) else ""
        name, version = str(c.get("name", "")) if purl else "", str(c.get("version", "")) if purl else ""
        if purl.startswith("pkg:pypi/"):
            out.append(Package("PyPI", _normalize(name), version, f"{name} {version}",
                               frozenset({name.lower(), _normalize(name)})))
        elif purl.startswith("pkg:deb/"):
            upstream = re.search(r"[?&]upstream=([^&]+)", purl)
            source = _property(c, "trainer:source-package") or (unquote(upstream[1]) if upstream else "") or name
            debs.setdefault((source, _property(c, "trainer:source-version") or version), []).append(name)
    for (source, version), binaries in sorted(debs.items()):
        built = sorted(set(binaries) - {source})
        label = f"{source} {version}" + (f" ({', '.join(built[:5])}{', ...' if len(built) > 5 else ''})"
                                         if built else "")
        out.append(Package(system, source, version, label, frozenset({source, *binaries})))
    return out


# ---- what is known ------------------------------------------------------------------------------

def records(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """OSV records from zips (osv.dev's exports), directories of ``*.json`` or JSON files (a record or a list)."""
    for path in paths:
        if path.is_dir():
            for item in sorted(path.rglob("*.json")):
                yield from _decoded(item.read_bytes(), str(item))
        elif path.suffix == ".zip":
            try:
                with zipfile.ZipFile(path) as archive:
                    for info in archive.infolist():
                        if info.filename.endswith(".json"):
                            yield from _decoded(archive.read(info), f"{path}:{info.filename}")
            except (OSError, zipfile.BadZipFile) as exc:
                raise GateError(f"{path}: not a readable zip of OSV records ({exc})") from None
        elif path.is_file():
            yield from _decoded(path.read_bytes(), str(path))
        else:
            raise GateError(f"{path}: no such advisory database (a zip, a directory or a JSON file of OSV records)")


def _decoded(data: bytes, where: str) -> Iterator[dict[str, Any]]:
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise GateError(f"{where}: not JSON ({exc})") from None
    for record in value if isinstance(value, list) else [value]:
        if not isinstance(record, dict) or not isinstance(record.get("id"), str):
            raise GateError(f"{where}: not an OSV record (no id)")
        yield record


def affected_range(version: str, ecosystem: str, entry: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether ``version`` is affected by one ``affected`` entry, and the version that fixes it (None: no fix known).
    Each ECOSYSTEM range's events are taken in version order, as the OSV schema evaluates them."""
    listed = version in [str(v) for v in entry.get("versions", [])]
    hit, fix = False, None
    for rng in entry.get("ranges", []):
        if not isinstance(rng, dict) or rng.get("type") != "ECOSYSTEM":
            continue
        pairs = [(str(kind), str(value)) for e in rng.get("events", []) if isinstance(e, dict)
                 for kind, value in e.items() if kind in ("introduced", "fixed", "last_affected")]
        def by_version(x: tuple[str, str], y: tuple[str, str]) -> int:
            return compare(ecosystem, x[1], y[1])
        events = sorted(pairs, key=functools.cmp_to_key(by_version))
        inside = False
        for kind, value in events:
            order = compare(ecosystem, version, value)
            if kind == "introduced" and order >= 0:
                inside = True
            elif (kind == "fixed" and order >= 0) or (kind == "last_affected" and order > 0):
                inside = False
        if not inside:
            continue
        hit = True
        after = next(((k, v) for k, v in events if compare(ecosystem, v, version) > 0 or
                      (k == "last_affected" and v == version)), None)
        if after is not None and after[0] == "fixed" and (fix is None or compare(ecosystem, after[1], fix) < 0):
            fix = after[1]
    return hit or listed, fix


def cvss3_score(vector: str) -> float | None:
    """A CVSS v3.x vector's base score (FIRST's specification, section 7.1); None for another form."""
    parts = dict(p.split(":", 1) for p in vector.split("/")[1:] if ":" in p)
    if not vector.startswith("CVSS:3") or not {"AV", "AC", "PR", "UI", "S", "C", "I", "A"} <= set(parts):
        return None
    changed = parts["S"] == "C"
    try:
        av = {"N": 0.85, "A": 0.62, "L": 0.55, "P": 0.2}[parts["AV"]]
        ac = {"L": 0.77, "H": 0.44}[parts["AC"]]
        pr = {"N": 0.85, "L": 0.68 if changed else 0.62, "H": 0.5 if changed else 0.27}[parts["PR"]]
        ui = {"N": 0.85, "R": 0.62}[parts["UI"]]
        cia = [{"H": 0.56, "L": 0.22, "N": 0.0}[parts[k]] for k in ("C", "I", "A")]
    except KeyError:
        return None
    iss = 1 - (1 - cia[0]) * (1 - cia[1]) * (1 - cia[2])
    impact = 7.52 * (iss - 0.029) - 3.25 * (iss - 0.02) ** 15 if changed else 6.42 * iss
    if impact <= 0:
        return 0.0
    exploitability = 8.22 * av * ac * pr * ui
    total = min((1.08 if changed else 1.0) * (impact + exploitability), 10.0)
    scaled = round(total * 100000)
    return scaled / 100000.0 if scaled % 10000 == 0 else (math.floor(scaled / 10000) + 1) / 10.0


def severity(record: dict[str, Any], entry: dict[str, Any]) -> int | None:
    """The highest level the record gives (0 negligible .. 4 critical); None when it gives none this reads."""
    found: list[int] = []
    for where in (record.get("database_specific"), entry.get("ecosystem_specific"), entry.get("database_specific")):
        if isinstance(where, dict):
            for key in ("severity", "urgency"):
                label = str(where.get(key, "")).lower()
                found += [LEVELS[label]] if label in LEVELS else []
    for item in [*record.get("severity", []), *entry.get("severity", [])]:
        score = str(item.get("score", "")) if isinstance(item, dict) else ""
        if score.lower() in LEVELS:
            found.append(LEVELS[score.lower()])
        elif (value := cvss3_score(score)) is not None:
            found.append(4 if value >= 9 else 3 if value >= 7 else 2 if value >= 4 else 1 if value > 0 else 0)
    return max(found) if found else None


@dataclass
class Finding:
    """One vulnerability of one package: the advisory (and the ids of the same vulnerability), its level, its fix."""

    package: Package
    ids: list[str]  # the advisory's id first, then its aliases and those of records naming the same vulnerability
    level: int | None
    fixed: str | None
    status: str = "note"  # fail | allowed | note
    why: str = ""

    def line(self) -> str:
        level = NAMES.get(self.level, "severity unknown") if self.level is not None else "severity unknown"
        fix = f"fixed in {self.fixed}" if self.fixed else "no fixed version"
        others = f" ({', '.join(self.ids[1:4])}{', ...' if len(self.ids) > 4 else ''})" if len(self.ids) > 1 else ""
        return f"{self.ids[0]}{others} in {self.package.label}: {level}, {fix}"

    def to_dict(self) -> dict[str, Any]:
        return {"ids": self.ids, "package": self.package.label, "ecosystem": self.package.ecosystem,
                "severity": NAMES.get(self.level) if self.level is not None else None, "fixed": self.fixed,
                "status": self.status, "why": self.why}


def findings(installed: list[Package], database: Iterable[dict[str, Any]]) -> list[Finding]:
    """Every (package, vulnerability) the database covers; records that alias each other count once."""
    wanted: dict[tuple[str, str], list[Package]] = {}
    for package in installed:
        wanted.setdefault((package.ecosystem, package.name), []).append(package)
    found: dict[tuple[Package, str], Finding] = {}
    for record in database:
        if record.get("withdrawn"):
            continue
        ids = [record["id"], *(str(a) for a in record.get("aliases", []) if a != record["id"])]
        for entry in record.get("affected", []):
            pkg = entry.get("package", {}) if isinstance(entry, dict) else {}
            name = _normalize(str(pkg.get("name", ""))) if pkg.get("ecosystem") == "PyPI" else str(pkg.get("name"))
            for package in wanted.get((str(pkg.get("ecosystem", "")), name), []):
                try:
                    hit, fixed = affected_range(package.version, package.ecosystem, entry)
                except ValueError:
                    continue  # a version this ecosystem's order cannot read: not a finding we can state
                if hit:
                    _merge(found, Finding(package, ids, severity(record, entry), fixed))
    unique = list({id(f): f for f in found.values()}.values())  # a merged finding is found under each of its ids
    return sorted(unique, key=lambda f: (f.package.label, f.ids[0]))


def _merge(found: dict[tuple[Package, str], Finding], new: Finding) -> None:
    """One finding per package and vulnerability: a record whose ids meet a known finding's joins it."""
    same: list[Finding] = []
    for key in ((new.package, i) for i in new.ids):
        if key in found and all(found[key] is not f for f in same):
            same.append(found[key])
    for old in same:
        new.ids = [*old.ids, *(i for i in new.ids if i not in old.ids)]
        levels = [x for x in (old.level, new.level) if x is not None]
        new.level = max(levels) if levels else None
        fixes = [x for x in (old.fixed, new.fixed) if x is not None]
        new.fixed = _lowest(new.package.ecosystem, fixes)
    for i in new.ids:
        found[(new.package, i)] = new


def _lowest(ecosystem: str, versions: list[str]) -> str | None:
    """The lowest of ``versions`` in the ecosystem's order (None for none)."""
    lowest: str | None = None
    for version in versions:
        if lowest is None or compare(ecosystem, version, lowest) < 0:
            lowest = version
    return lowest


# ---- the allowlist ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """One allowlisted finding: which, why, until when, where."""

    id: str
    reason: str
    expires: datetime.date
    package: str = ""
    images: tuple[str, ...] = ()

    def covers(self, finding: Finding, image: str) -> bool:
        return (self.id.upper() in (i.upper() for i in finding.ids)
                and (not self.package or self.package in finding.package.names)
                and (not self.images or image in self.images))


def allowlist(path: Path) -> list[Entry]:
    """The allowlist's entries, each checked: an id, a reason and an expiry date, nothing unknown."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise GateError(f"{path}: not a readable TOML allowlist ({exc})") from None
    unknown = set(data) - {"ignore"}
    if unknown or not isinstance(data.get("ignore", []), list):
        raise GateError(f"{path}: only [[ignore]] entries belong here (found {', '.join(sorted(unknown)) or 'ignore'})")
    entries = []
    for n, item in enumerate(data.get("ignore", []), start=1):
        where = f"{path}: entry {n}"
        if not isinstance(item, dict) or set(item) - ENTRY_KEYS:
            raise GateError(f"{where}: keys are {', '.join(sorted(ENTRY_KEYS))}")
        if not str(item.get("id", "")).strip() or not str(item.get("reason", "")).strip():
            raise GateError(f"{where}: needs an id and a reason (why the finding may pass)")
        expires = item.get("expires")
        if not isinstance(expires, datetime.date) or isinstance(expires, datetime.datetime):
            raise GateError(f"{where} ({item['id']}): needs expires = YYYY-MM-DD (a TOML date): until when it holds")
        images = item.get("images", [])
        if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
            raise GateError(f"{where} ({item['id']}): images is a list of image names")
        entries.append(Entry(str(item["id"]).strip(), str(item["reason"]).strip(), expires,
                             str(item.get("package", "")), tuple(images)))
    return entries


# ---- the gate -------------------------------------------------------------------------------------

@dataclass
class Verdict:
    """What the gate decided: the findings with their status, the expired entries, the lines to print."""

    image: str
    findings: list[Finding] = field(default_factory=list)
    expired: list[Entry] = field(default_factory=list)

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "fail"]

    @property
    def passed(self) -> bool:
        return not self.failed and not self.expired

    def lines(self, allowlist_path: str) -> list[str]:
        """One line per failure and expired entry, then the outcome (what to do when it failed)."""
        out = [f"{self.image}: FAIL {f.line()}" for f in self.failed]
        out += [f"{self.image}: FAIL allowlist entry {e.id}{f' ({e.package})' if e.package else ''} expired on "
                f"{e.expires.isoformat()}: fix the finding, or give it a new reason and date" for e in self.expired]
        allowed = sum(f.status == "allowed" for f in self.findings)
        notes = len(self.findings) - len(self.failed) - allowed
        counts = f"{allowed} allowlisted, {notes} below high, without a fix or of unknown severity"
        if self.passed:
            return [*out, f"{self.image}: passed: no fixable high or critical finding outside the allowlist ({counts})"]
        return [*out, f"{self.image}: the build fails: {len(self.failed)} fixable high or critical finding(s) not "
                f"allowlisted, {len(self.expired)} expired allowlist entr{'y' if len(self.expired) == 1 else 'ies'} "
                f"({counts}); update the package, or add it to {allowlist_path} with a reason and an expiry date"]


def decide(found: list[Finding], entries: list[Entry], image: str, today: datetime.date) -> Verdict:
    """Each finding's status: allowed (an unexpired entry covers it), fail (fixable, high or critical) or note."""
    verdict = Verdict(image, found, [e for e in entries if e.expires <= today and (not e.images or image in e.images)])
    for finding in found:
        entry = next((e for e in entries if e.covers(finding, image)), None)
        if entry is not None and entry.expires > today:
            finding.status, finding.why = "allowed", f"{entry.reason} (until {entry.expires.isoformat()})"
        elif finding.fixed is not None and finding.level is not None and finding.level >= FAILING:
            finding.status = "fail"
            finding.why = f"allowlist entry expired on {entry.expires.isoformat()}" if entry else "not allowlisted"
    return verdict


def gate(sbom: Path, databases: list[Path], allowlist_path: Path, image: str,
         today: datetime.date) -> Verdict:
    """Read the inputs and decide (GateError for an input that cannot be read)."""
    try:
        doc = json.loads(sbom.read_text())
    except (OSError, ValueError) as exc:
        raise GateError(f"{sbom}: not a readable bill of materials ({exc})") from None
    if not isinstance(doc, dict) or doc.get("bomFormat") != "CycloneDX":
        raise GateError(f"{sbom}: not a CycloneDX document")
    entries = allowlist(allowlist_path)
    return decide(findings(packages(doc), records(databases)), entries, image, today)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sbom", type=Path, required=True, help="the image's CycloneDX bill of materials")
    parser.add_argument("--osv", type=Path, action="append", default=[], metavar="PATH",
                        help="OSV records: osv.dev's <ecosystem>/all.zip, a directory or a JSON file (repeatable)")
    parser.add_argument("--allowlist", type=Path, default=Path(ALLOWLIST), help=f"default {ALLOWLIST}")
    parser.add_argument("--image", default="image", help="the image's name (images/<name>/), for the allowlist")
    parser.add_argument("--report", type=Path, help="write every finding and its status here (JSON)")
    parser.add_argument("--today", type=datetime.date.fromisoformat, default=datetime.date.today(),
                        help="the day expiry dates are judged on (default: today)")
    args = parser.parse_args(argv)
    try:
        verdict = gate(args.sbom, args.osv, args.allowlist, args.image, args.today)
    except GateError as exc:
        print(f"vuln_gate: {exc}", file=sys.stderr)
        return 2
    if args.report:
        args.report.write_text(json.dumps({"image": args.image, "passed": verdict.passed,
                                           "findings": [f.to_dict() for f in verdict.findings],
                                           "expired": [e.id for e in verdict.expired]}, indent=1) + "\n")
    if not args.osv:
        print(f"vuln_gate: {args.image}: no advisory database given: the allowlist alone is checked")
    for line in verdict.lines(str(args.allowlist)):
        print(f"vuln_gate: {line}", file=sys.stdout if verdict.passed else sys.stderr)
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
