"""entrypoint/outputs/sbom.py: the bill of materials from dpkg's database and a venv's distributions, the same bytes for
the same packages, and what a job says of its image (the digest its spec passed, the document's hash).

The container tests compare the documents of the images `make test` builds with what each container reports
(tests/containers/test_supply_chain.py).
"""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint.doctor import checks
from entrypoint.outputs import sbom
from entrypoint.planning.plan import Plan
from tests.conftest import ROOT

DIGEST = "sha256:" + "ab" * 32
STATUS = """Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.36-9+deb12u4
Description: GNU C Library
 a continuation line: Status: nothing

Package: libssl3
Status: hold ok installed
Architecture: amd64
Source: openssl (3.0.15-1~deb12u1)
Version: 3.0.15-1~deb12u1+b1

Package: removed-but-configured
Status: deinstall ok config-files
Architecture: all
Version: 1.0

Package: tini
Status: install ok installed
Architecture: amd64
Version: 0.19.0-1
"""
DEP5 = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: tini

Files: *
Copyright: 2015 Thomas Orozco
License: MIT
 Permission is hereby granted...

Files: debian/*
License: GPL-2+
"""


@pytest.fixture
def system(tmp_path: Path) -> tuple[Path, Path]:
    status, docs = tmp_path / "status", tmp_path / "doc"
    status.write_text(STATUS)
    (docs / "tini").mkdir(parents=True)
    (docs / "tini" / "copyright").write_text(DEP5)
    (docs / "libc6").mkdir()
    (docs / "libc6" / "copyright").write_text("This is the Debian prepackaged version of the GNU C Library.\n")
    return status, docs


def test_installed_debs_with_their_source_package_and_dep5_licences(system: tuple[Path, Path]) -> None:
    found = {c.name: c for c in sbom.deb_packages(*system, release={"ID": "debian", "VERSION_ID": "12"})}
    assert set(found) == {"libc6", "libssl3", "tini"}  # config-files only: not installed
    assert (found["libc6"].source, found["libc6"].source_version) == ("glibc", "")
    assert (found["libssl3"].source, found["libssl3"].source_version) == ("openssl", "3.0.15-1~deb12u1")
    assert found["tini"].licenses == ("MIT", "GPL-2+") and found["libc6"].licenses == ()  # free-form: no names
    assert found["libssl3"].purl() == ("pkg:deb/debian/libssl3@3.0.15-1~deb12u1%2Bb1?arch=amd64&distro=debian-12"
                                       "&upstream=openssl")


def _dist(site: Path, name: str, version: str, *headers: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("\n".join(["Metadata-Version: 2.4", f"Name: {name}", f"Version: {version}",
                                              *headers]) + "\n\n")


def test_python_distributions_with_the_most_precise_licence_they_declare(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    _dist(site, "Scikit_Learn", "1.9.1", "License-Expression: BSD-3-Clause",
          "Classifier: License :: OSI Approved :: BSD License")
    _dist(site, "numpy", "2.4.6", "Classifier: License :: OSI Approved :: BSD License")
    _dist(site, "oddball", "0.1", "License: UNKNOWN")
    _dist(site, "plain", "1.0", "License: Apache 2.0")
    found = {c.name: c for c in sbom.python_packages([str(site)])}
    assert (found["Scikit_Learn"].expression, found["numpy"].licenses) == ("BSD-3-Clause", ("BSD License",))
    assert found["oddball"].licenses == () and found["plain"].licenses == ("Apache 2.0",)
    assert found["Scikit_Learn"].purl() == "pkg:pypi/scikit-learn@1.9.1"


def test_the_same_packages_give_the_same_bytes(system: tuple[Path, Path], tmp_path: Path) -> None:
    release = {"ID": "debian", "VERSION_ID": "12", "PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)"}
    debs = sbom.deb_packages(*system, release=release)
    one = sbom.render(sbom.document(debs, release, {"framework": "x", "variant": "cpu"}))
    two = sbom.render(sbom.document(list(reversed(debs)), release, {"variant": "cpu", "framework": "x"}))
    assert one == two
    doc = json.loads(one)
    assert (doc["bomFormat"], doc["specVersion"]) == ("CycloneDX", "1.5") and doc["serialNumber"].startswith("urn:uuid")
    assert doc["components"][0]["type"] == "operating-system"
    assert sbom.inventory(doc)["deb"] == {("libc6", "2.36-9+deb12u4", "amd64"), ("libssl3", "3.0.15-1~deb12u1+b1",
                                                                               "amd64"), ("tini", "0.19.0-1", "amd64")}
    other = json.loads(sbom.render(sbom.document(debs[:2], release, {"framework": "x", "variant": "cpu"})))
    assert other["serialNumber"] != doc["serialNumber"]


def test_this_interpreters_own_packages_are_listed_not_pythonpaths(tmp_path: Path) -> None:
    out = tmp_path / "sbom.cdx.json"
    code = subprocess.run([sys.executable, "-m", "entrypoint", "sbom", "write", str(out), "--variant", "cpu"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert code.returncode == 0, code.stderr
    listed = sbom.inventory(sbom.read(out))["pypi"]
    assert ("pytest", __import__("pytest").__version__) in listed
    assert not any(name == "trainers" for name, _ in listed)  # the checkout on PYTHONPATH is no distribution
    assert out.stat().st_mode & 0o777 == 0o644
    assert code.stdout.startswith(f"{out}: sha256:{hashlib.sha256(out.read_bytes()).hexdigest()}")


@pytest.mark.parametrize(("reference", "digest", "says"), [
    (f"us-docker.pkg.dev/p/r/pytorch@{DIGEST}", DIGEST, "from the job's spec"),
    ("us-docker.pkg.dev/p/r/pytorch:v1", "", "by tag"),
    (None, "", "reference unknown"),
])
def test_what_a_job_knows_of_its_image(tmp_path: Path, reference: str | None, digest: str, says: str) -> None:
    doc = tmp_path / "sbom.cdx.json"
    doc.write_text(json.dumps({"bomFormat": "CycloneDX", "components": [
        {"name": "numpy", "version": "2.4.6", "purl": "pkg:pypi/numpy@2.4.6"}]}))
    found = sbom.identify(reference, str(doc))
    assert (found.digest, found.sbom_sha256, found.packages) == (digest, hashlib.sha256(doc.read_bytes()).hexdigest(),
                                                                 1)
    assert says in found.text() and found.sbom_sha256 in found.text()
    assert checks.image(found).status == "ok"
    missing = sbom.identify(reference, str(tmp_path / "none.json"))
    assert (missing.sbom, missing.sbom_sha256) == ("", "") and "no bill of materials" in missing.text()
    assert checks.image(missing).status == ("ok" if digest else "skipped")


def test_the_plan_carries_the_image_through_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from entrypoint.cli import build_plan
    from entrypoint.options import RunOptions

    doc = tmp_path / "sbom.cdx.json"
    doc.write_text(json.dumps({"bomFormat": "CycloneDX", "components": []}))
    monkeypatch.setenv("TRAINER_IMAGE", f"r/pytorch@{DIGEST}")
    monkeypatch.setenv("TRAINER_SBOM", str(doc))
    plan = build_plan(RunOptions(framework="pytorch", module="trainers.digits_torch"))
    assert plan.image.digest == DIGEST and plan.describe()["image"]["sbom"] == str(doc)
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))).image == plan.image


def test_every_training_summary_names_the_image() -> None:
    """Each framework builds its own TrainingSummary; one that leaves out ``image=`` reports `{}` (as JAX once did),
    so every call under entrypoint/ must pass it (the JAX tier proves a real run's value)."""
    calls: list[str] = []
    missing: list[str] = []
    for module in sorted((ROOT / "entrypoint").rglob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) != "TrainingSummary":
                continue
            where = f"{module.relative_to(ROOT)}:{node.lineno}"
            calls.append(where)
            if "image" not in {k.arg for k in node.keywords}:
                missing.append(where)
    assert len(calls) >= 3, calls  # PyTorch/Horovod, TensorFlow, JAX: the walk finds them
    assert not missing, f"TrainingSummary(...) without image=: {missing}"
