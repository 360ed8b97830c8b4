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

The gate's parts, each standard library only: vuln_versions.py (the ecosystems' version orders), vuln_findings.py
(the bill of materials' packages, the OSV records, the findings where they meet); this module is the allowlist, the
decision and the command line, and offers the names of the other two its callers use (images/supply_chain.py, the
tests).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

# ``x as x``: names of the other two parts that callers take from here (supply_chain.py: GateError; the tests)
from vuln_findings import Finding, findings, packages, records
from vuln_findings import GateError as GateError
from vuln_findings import affected_range as affected_range
from vuln_findings import cvss3_score as cvss3_score
from vuln_findings import severity as severity
from vuln_versions import compare as compare
from vuln_versions import dpkg_compare as dpkg_compare

FAILING = 3  # high and critical
ENTRY_KEYS = {"id", "reason", "expires", "package", "images"}
ALLOWLIST = "images/vulnerability-allowlist.toml"


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
