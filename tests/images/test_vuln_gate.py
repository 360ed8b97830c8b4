"""images/vuln_gate.py: versions ordered as their ecosystems order them, OSV ranges read as the schema says, severity
from every label a record carries, the allowlist's rules, and the command's exit codes and lines.

The fixtures are OSV records in osv.dev's own shape; the container tests (tests/containers/test_supply_chain.py)
run the gate on the bills of materials of the images `make test` builds.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.containers.engine import vuln_gate

pytestmark = pytest.mark.images
TODAY = datetime.date(2026, 6, 1)
GATE = [sys.executable, str(ROOT / "images" / "vuln_gate.py")]


@pytest.mark.parametrize(("a", "b"), [
    ("1.0.dev0", "1.0a1"), ("1.0a1", "1.0b1"), ("1.0b2", "1.0rc1"), ("1.0rc1", "1.0"), ("1.0", "1.0.post1"),
    ("1.0", "1.0.1"), ("1.9", "1.10"), ("2.13.0", "2.13.0+cpu"), ("1!0.1", "1!1.0"), ("9.0", "1!0.1"),
    ("2.4.6", "2.4.7"), ("0", "0.0.1"),
])
def test_python_versions_are_ordered_as_pep_440_orders_them(a: str, b: str) -> None:
    assert vuln_gate.compare("PyPI", a, b) < 0 < vuln_gate.compare("PyPI", b, a)
    assert vuln_gate.compare("PyPI", "1.0.0", "1.0") == 0  # trailing zeros do not count


@pytest.mark.parametrize(("a", "b"), [
    ("1.0~rc1", "1.0"), ("1.0", "1.0-1"), ("2.36-9+deb12u4", "2.36-9+deb12u10"), ("2.0", "1:1.0"),
    ("3.0.13-1~deb12u1", "3.0.13-1"), ("1.2.3a", "1.2.3b"), ("1.2-1", "1.2-1.1"), ("9.9", "10.0"),
])
def test_debian_versions_are_ordered_as_dpkg_orders_them(a: str, b: str) -> None:
    assert vuln_gate.compare("Debian:12", a, b) < 0 < vuln_gate.compare("Debian:12", b, a)
    assert vuln_gate.dpkg_compare("0:1.0-1", "1.0-1") == 0


@pytest.mark.parametrize(("vector", "score"), [
    ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H", 9.8), ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:N/I:N/A:H", 7.5),
    ("CVSS:3.1/AV:N/AC:L/PR:L/UI:N/S:C/C:L/I:L/A:N", 6.4), ("CVSS:3.0/AV:L/AC:H/PR:H/UI:R/S:U/C:L/I:N/A:N", 1.8),
    ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:C/C:H/I:H/A:H", 10.0), ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:N/I:N/A:N", 0.0),
])
def test_cvss_3_base_scores_are_firsts(vector: str, score: float) -> None:
    """Scores of NVD's calculator for the same vectors (FIRST's CVSS v3.1 specification, 7.1)."""
    assert vuln_gate.cvss3_score(vector) == score
    assert vuln_gate.cvss3_score("CVSS:4.0/AV:N/AC:L/AT:N/PR:N/UI:N/VC:H/VI:H/VA:H/SC:N/SI:N/SA:N") is None


def _range(*events: dict[str, str]) -> dict[str, Any]:
    return {"ranges": [{"type": "ECOSYSTEM", "events": list(events)}]}


@pytest.mark.parametrize(("version", "entry", "expected"), [
    ("1.5", _range({"introduced": "0"}, {"fixed": "2.0"}), (True, "2.0")),
    ("2.0", _range({"introduced": "0"}, {"fixed": "2.0"}), (False, None)),
    ("0.9", _range({"introduced": "1.0"}, {"fixed": "2.0"}), (False, None)),
    ("1.5", _range({"fixed": "2.0"}, {"introduced": "0"}), (True, "2.0")),  # events in any order
    ("3.1", _range({"introduced": "1.0"}, {"fixed": "2.0"}, {"introduced": "3.0"}, {"fixed": "3.2"}), (True, "3.2")),
    ("2.5", _range({"introduced": "1.0"}, {"fixed": "2.0"}, {"introduced": "3.0"}, {"fixed": "3.2"}), (False, None)),
    ("1.5", _range({"introduced": "0"}, {"last_affected": "1.5"}), (True, None)),  # affected, no fix
    ("1.6", _range({"introduced": "0"}, {"last_affected": "1.5"}), (False, None)),
    ("4.0", _range({"introduced": "0"}), (True, None)),
    ("1.1", {"versions": ["1.1"]}, (True, None)),
])
def test_osv_ranges_are_evaluated_in_version_order(version: str, entry: dict[str, Any],
                                                   expected: tuple[bool, str | None]) -> None:
    assert vuln_gate.affected_range(version, "PyPI", entry) == expected


@pytest.mark.parametrize(("record", "entry", "level"), [
    ({"database_specific": {"severity": "HIGH"}}, {}, 3),  # GitHub's label
    ({"severity": [{"type": "Ubuntu", "score": "medium"}]}, {}, 2),  # Ubuntu's priority
    ({}, {"ecosystem_specific": {"urgency": "high"}}, 3),  # Debian's urgency
    ({"severity": [{"type": "CVSS_V3", "score": "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H"}]}, {}, 4),
    ({"database_specific": {"severity": "MODERATE"},
      "severity": [{"type": "CVSS_V3", "score": "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:N/I:N/A:H"}]}, {}, 3),
    ({"severity": [{"type": "CVSS_V4", "score": "CVSS:4.0/AV:N"}]}, {}, None),
])
def test_severity_is_the_highest_label_or_score_a_record_gives(record: dict[str, Any], entry: dict[str, Any],
                                                               level: int | None) -> None:
    assert vuln_gate.severity(record, entry) == level


def sbom(tmp: Path, os_name: str = "debian", os_version: str = "12") -> Path:
    """A small bill of materials in the shape `python -m entrypoint sbom write` gives it."""
    components: list[dict[str, Any]] = [
        {"type": "operating-system", "name": os_name, "version": os_version,
         "description": f"{os_name} {os_version}" + (" LTS" if os_name == "ubuntu" else "")},
        {"type": "library", "name": "NumPy", "version": "2.4.6", "purl": "pkg:pypi/numpy@2.4.6"},
    ]
    for binary in ("libc6", "libc-bin"):
        components.append({"type": "library", "name": binary, "version": "2.36-9+deb12u4",
                           "purl": f"pkg:deb/{os_name}/{binary}@2.36-9%2Bdeb12u4?arch=amd64&upstream=glibc",
                           "properties": [{"name": "trainer:source-package", "value": "glibc"}]})
    path = tmp / "sbom.cdx.json"
    path.write_text(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.5", "components": components}))
    return path


def advisories(tmp: Path, ecosystem: str = "Debian:12") -> Path:
    """Two findings of osv.dev's shapes: a GitHub advisory and its PYSEC twin (one vulnerability), a distro one."""
    records = [
        {"id": "GHSA-aaaa-bbbb-cccc", "aliases": ["CVE-2099-1"], "database_specific": {"severity": "HIGH"},
         "affected": [{"package": {"ecosystem": "PyPI", "name": "numpy"},
                       **_range({"introduced": "0"}, {"fixed": "2.4.7"})}]},
        {"id": "PYSEC-2099-1", "aliases": ["CVE-2099-1"],
         "affected": [{"package": {"ecosystem": "PyPI", "name": "NumPy"},
                       **_range({"introduced": "2.0"}, {"fixed": "2.4.7"})}]},
        {"id": "DEBIAN-CVE-2099-2", "affected": [{"package": {"ecosystem": ecosystem, "name": "glibc"},
                                                  "ecosystem_specific": {"urgency": "high"},
                                                  **_range({"introduced": "0"}, {"fixed": "2.36-9+deb12u10"})}]},
        {"id": "GHSA-low-only", "database_specific": {"severity": "LOW"},
         "affected": [{"package": {"ecosystem": "PyPI", "name": "numpy"}, **_range({"introduced": "0"},
                                                                                  {"fixed": "3.0"})}]},
        {"id": "GHSA-withdrawn", "withdrawn": "2026-01-01T00:00:00Z", "database_specific": {"severity": "CRITICAL"},
         "affected": [{"package": {"ecosystem": "PyPI", "name": "numpy"}, **_range({"introduced": "0"},
                                                                                  {"fixed": "3.0"})}]},
    ]
    path = tmp / "osv.zip"
    with zipfile.ZipFile(path, "w") as archive:  # as osv.dev exports them: one <id>.json per record
        for record in records:
            archive.writestr(f"{record['id']}.json", json.dumps(record))
    return path


def allow(tmp: Path, text: str) -> Path:
    path = tmp / "allowlist.toml"
    path.write_text(text)
    return path


def test_findings_merge_aliases_and_count_a_source_package_once(tmp_path: Path) -> None:
    verdict = vuln_gate.gate(sbom(tmp_path), [advisories(tmp_path)], allow(tmp_path, ""), "pytorch", TODAY)
    by_id = {f.ids[0]: f for f in verdict.findings}
    assert set(by_id) == {"GHSA-aaaa-bbbb-cccc", "DEBIAN-CVE-2099-2", "GHSA-low-only"}  # withdrawn: none
    numpy = by_id["GHSA-aaaa-bbbb-cccc"]
    assert set(numpy.ids) == {"GHSA-aaaa-bbbb-cccc", "CVE-2099-1", "PYSEC-2099-1"} and numpy.fixed == "2.4.7"
    glibc = by_id["DEBIAN-CVE-2099-2"]
    assert glibc.package.label == "glibc 2.36-9+deb12u4 (libc-bin, libc6)" and glibc.status == "fail"
    assert by_id["GHSA-low-only"].status == "note" and not verdict.passed


def test_an_ubuntu_image_is_matched_against_its_lts_ecosystem(tmp_path: Path) -> None:
    found = vuln_gate.gate(sbom(tmp_path, "ubuntu", "24.04"), [advisories(tmp_path, "Ubuntu:24.04:LTS")],
                           allow(tmp_path, ""), "pytorch", TODAY).findings
    assert "DEBIAN-CVE-2099-2" in {f.ids[0] for f in found}
    found = vuln_gate.gate(sbom(tmp_path, "ubuntu", "24.04"), [advisories(tmp_path, "Ubuntu:22.04:LTS")],
                           allow(tmp_path, ""), "pytorch", TODAY).findings
    assert "DEBIAN-CVE-2099-2" not in {f.ids[0] for f in found}


ENTRIES = """
[[ignore]]
id = "cve-2099-1"
package = "numpy"
reason = "the vulnerable function is never called by a trainer"
expires = {numpy}

[[ignore]]
id = "DEBIAN-CVE-2099-2"
package = "libc6"
images = ["pytorch"]
reason = "waits for the base image's next point release"
expires = {glibc}
"""


def test_allowlisted_findings_pass_until_their_entry_expires(tmp_path: Path) -> None:
    sb, db = sbom(tmp_path), [advisories(tmp_path)]
    passing = vuln_gate.gate(sb, db, allow(tmp_path, ENTRIES.format(numpy="2026-07-01", glibc="2026-06-02")),
                             "pytorch", TODAY)
    assert passing.passed and {f.status for f in passing.findings} == {"allowed", "note"}
    other_image = vuln_gate.gate(sb, db, allow(tmp_path, ENTRIES.format(numpy="2026-07-01", glibc="2026-06-02")),
                                 "tensorflow", TODAY)
    assert [f.ids[0] for f in other_image.failed] == ["DEBIAN-CVE-2099-2"]  # the entry names another image
    expired = vuln_gate.gate(sb, db, allow(tmp_path, ENTRIES.format(numpy="2026-07-01", glibc="2026-06-01")),
                             "pytorch", TODAY)  # expires today: no longer holds
    assert not expired.passed and [e.id for e in expired.expired] == ["DEBIAN-CVE-2099-2"]
    assert [f.ids[0] for f in expired.failed] == ["DEBIAN-CVE-2099-2"]


def test_an_expired_entry_fails_even_when_its_finding_is_gone(tmp_path: Path) -> None:
    verdict = vuln_gate.gate(sbom(tmp_path), [], allow(tmp_path, ENTRIES.format(numpy="2020-01-01",
                                                                                 glibc="2030-01-01")), "x", TODAY)
    assert not verdict.passed and not verdict.findings and [e.id for e in verdict.expired] == ["cve-2099-1"]
    assert "expired on 2020-01-01" in verdict.lines("allowlist.toml")[0]


@pytest.mark.parametrize(("text", "says"), [
    ('[[ignore]]\nid = "X"\nexpires = 2030-01-01\n', "needs an id and a reason"),
    ('[[ignore]]\nid = "X"\nreason = "r"\n', "needs expires"),
    ('[[ignore]]\nid = "X"\nreason = "r"\nexpires = "2030-01-01"\n', "needs expires"),  # a string, not a date
    ('[[ignore]]\nid = "X"\nreason = "r"\nexpires = 2030-01-01T00:00:00\n', "needs expires"),
    ('[[ignore]]\nid = "X"\nreason = "r"\nexpires = 2030-01-01\nstatement = "s"\n', "keys are"),
    ('[[vulnerabilities]]\nid = "X"\n', "only [[ignore]] entries"),
    ("[[ignore]\n", "not a readable TOML allowlist"),
])
def test_an_allowlist_entry_without_its_reason_or_date_is_refused(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(vuln_gate.GateError, match=says.replace("[", r"\[")):
        vuln_gate.allowlist(allow(tmp_path, text))


def test_the_command_exits_0_1_or_2_with_its_lines_and_report(tmp_path: Path) -> None:
    sb, db, report = sbom(tmp_path), advisories(tmp_path), tmp_path / "report.json"
    failed = subprocess.run([*GATE, "--sbom", str(sb), "--osv", str(db), "--allowlist", str(allow(tmp_path, "")),
                             "--image", "pytorch", "--today", "2026-06-01", "--report", str(report)],
                            capture_output=True, text=True, timeout=60, check=False)
    lines = failed.stderr.strip().splitlines()
    assert failed.returncode == 1, failed.stderr
    assert lines[0].startswith("vuln_gate: pytorch: FAIL ") and "the build fails" in lines[-1], lines
    assert {f["status"] for f in json.loads(report.read_text())["findings"]} == {"fail", "note"}
    ok = subprocess.run([*GATE, "--sbom", str(sb), "--allowlist", str(ROOT / "images/vulnerability-allowlist.toml")],
                        capture_output=True, text=True, timeout=60, check=False)
    assert ok.returncode == 0 and "passed" in ok.stdout, ok.stdout + ok.stderr
    bad = subprocess.run([*GATE, "--sbom", str(tmp_path / "missing.json")], capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_the_repositorys_allowlist_is_valid_and_has_no_expired_entry() -> None:
    entries = vuln_gate.allowlist(ROOT / "images" / "vulnerability-allowlist.toml")
    assert all(e.expires > datetime.date.today() for e in entries), [e.id for e in entries]
