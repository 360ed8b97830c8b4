"""The vulnerability gate's findings (vuln_gate.py): what is installed, what is known, and where the two meet.

- what is installed: the packages of an image's CycloneDX bill of materials as advisories name them (a deb by its
  source package and version, a Python distribution by its normalized name);
- what is known: OSV records (https://ossf.github.io/osv-schema/) read from osv.dev's zipped exports, directories or
  JSON files;
- a finding: a package whose version a record's ``affected`` entry covers (its ECOSYSTEM ranges, read in the
  ecosystem's order: vuln_versions.py, or its ``versions`` list), with its severity (the record's labels and CVSS v3
  base scores) and the lowest version that fixes it; records that alias each other make one finding.

The allowlist and the decision are vuln_gate.py's. Standard library only (Python >= 3.11): it runs in the images
themselves.
"""

from __future__ import annotations

import functools
import json
import math
import re
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from vuln_versions import compare

LEVELS = {"negligible": 0, "unimportant": 0, "low": 1, "medium": 2, "moderate": 2, "high": 3, "critical": 4}
NAMES = {0: "negligible", 1: "low", 2: "medium", 3: "high", 4: "critical"}


class GateError(Exception):
    """An input the gate cannot read: one line naming it."""


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
