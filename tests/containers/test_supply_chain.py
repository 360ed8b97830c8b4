"""What each CPU image `make test` builds is made of, and the gate on it (docs/images.md, "Bill of materials",
"Vulnerability gate"): the image's bill of materials lists exactly the packages the running container reports (pip's
list of the venv, dpkg's installed packages), the local build keeps the same bytes beside the image, and the gate fails
on an injected advisory, passes it once allowlisted, and fails again when that entry has expired."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from entrypoint.outputs import sbom
from tests.conftest import ROOT
from tests.containers.engine import Container, common, run, supply_chain

pytestmark = pytest.mark.containers
IMAGES = common.IMAGES
SPLIT = "@@@ trainer-test @@@"
REPORT = (f"cat {sbom.SBOM_PATH}; echo '{SPLIT}'; python -m pip list --format json --disable-pip-version-check; "
          f"echo '{SPLIT}'; dpkg-query -W -f '${{db:Status-Status}} ${{Package}} ${{Version}} ${{Architecture}}\\n'")


@pytest.mark.parametrize("image", IMAGES)
def test_the_bill_of_materials_lists_every_package_the_container_reports(engine: Any, built: Any,
                                                                         image: str) -> None:
    proc = run(Container(engine, built(image), ["-c", REPORT], entrypoint="bash"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    document, pip_list, dpkg = proc.stdout.split(f"{SPLIT}\n")
    listed = sbom.inventory(json.loads(document))
    pip = {(sbom.normalize(p["name"]), p["version"]) for p in json.loads(pip_list)}
    debs = {tuple(line.split()[1:4]) for line in dpkg.splitlines() if line.split()[:1] == ["installed"]}
    assert listed["pypi"] == pip, f"only in the SBOM: {listed['pypi'] - pip}; only in pip: {pip - listed['pypi']}"
    assert listed["deb"] == debs, f"only in the SBOM: {listed['deb'] - debs}; only in dpkg: {debs - listed['deb']}"
    assert len(pip) > 30 and len(debs) > 80  # the venv and the OS, not an empty shell
    python = [c for c in sbom.packages(json.loads(document)) if sbom.kind_of(c) == "pypi"]
    assert sum(bool(c.get("licenses")) for c in python) >= 0.9 * len(python), "Python packages without a licence"
    beside = supply_chain.keep_sbom(engine, image, "cpu")  # what images/local_build.py keeps beside the image
    assert beside.read_text() == document


def _finding(doc: dict[str, Any]) -> tuple[str, str, str, str]:
    """A real package of the image for the fixture advisories: numpy (PyPI) and the OS's tini (its source package)."""
    numpy = next(c["version"] for c in sbom.packages(doc) if c["name"].lower() == "numpy")
    tini = next(c for c in sbom.packages(doc) if c["name"] == "tini")
    source = next((p["value"] for p in tini.get("properties", []) if p["name"] == sbom.SOURCE), "tini")
    system = next(c for c in doc["components"] if c["type"] == "operating-system")
    ecosystem = f"Debian:{system['version']}" if system["name"] == "debian" else f"Ubuntu:{system['version']}:LTS"
    return numpy, source, tini["version"], ecosystem


def _gate(image: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "images" / "local_build.py"), "gate", image, *args],
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("image", IMAGES)
def test_the_gate_fails_an_injected_finding_passes_it_allowlisted_and_fails_it_expired(
        engine: Any, built: Any, image: str, tmp_path: Path) -> None:
    built(image)
    doc = json.loads(supply_chain.keep_sbom(engine, image, "cpu").read_text())
    numpy, source, version, ecosystem = _finding(doc)
    advisories = tmp_path / "osv"
    advisories.mkdir()
    (advisories / "GHSA-test-numpy.json").write_text(json.dumps({
        "id": "GHSA-test-numpy", "aliases": ["CVE-2099-11"], "database_specific": {"severity": "CRITICAL"},
        "affected": [{"package": {"ecosystem": "PyPI", "name": "numpy"}, "ranges": [
            {"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": f"{numpy}.post1"}]}]}]}))
    (advisories / "DEB-test-tini.json").write_text(json.dumps({
        "id": "DEB-test-tini", "affected": [{"package": {"ecosystem": ecosystem, "name": source},
                                             "ecosystem_specific": {"urgency": "high"}, "ranges": [
            {"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": f"{version}+fix1"}]}]}]}))
    allowlist = tmp_path / "allowlist.toml"
    allowlist.write_text("")
    failed = _gate(image, "--osv", str(advisories), "--allowlist", str(allowlist))
    assert failed.returncode == 1, failed.stdout + failed.stderr
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("local_build: vulnerability gate") and "2 fixable high or critical" in last, last
    assert "GHSA-test-numpy" in failed.stdout and "DEB-test-tini" in failed.stdout, failed.stdout
    entries = "\n".join(f'[[ignore]]\nid = "{i}"\nreason = "a fixture"\nexpires = {{day}}\n'
                        for i in ("CVE-2099-11", "DEB-test-tini"))
    allowlist.write_text(entries.format(day="2999-01-01"))
    passed = _gate(image, "--osv", str(advisories), "--allowlist", str(allowlist))
    assert passed.returncode == 0 and "2 allowlisted" in passed.stdout, passed.stdout + passed.stderr
    allowlist.write_text(entries.format(day="2001-01-01"))
    expired = _gate(image, "--osv", str(advisories), "--allowlist", str(allowlist))
    assert expired.returncode == 1 and re.search(r"expired on 2001-01-01", expired.stdout), expired.stdout
