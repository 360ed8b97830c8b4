"""The image's bill of materials: a CycloneDX 1.5 JSON document made at build time from what is installed, kept in the
image at ``/usr/share/trainer/sbom.cdx.json`` (docs/images.md, "Bill of materials"), and what a job reads of it.

- OS packages: dpkg's status database (``/var/lib/dpkg/status``), every package whose status says ``installed``: name,
  version, architecture, its source package (``Source:``, what Debian's and Ubuntu's advisories name), and the licences
  its machine-readable copyright file (``/usr/share/doc/<package>/copyright``, DEP-5) declares;
- Python packages: every distribution installed in this interpreter's own site-packages (the image's venv; never
  ``PYTHONPATH``'s), read with importlib.metadata: name, version and licence (``License-Expression``, else the
  ``License ::`` classifiers, else a one-line ``License``).

Every Dockerfile writes it in one line, ``python -m entrypoint sbom write ...`` (images/catalog.py ``SBOM_LINE``), after
the last layer that installs anything: the package is installed in the layer before, so a change here rebuilds the
document. No network, no tool besides the interpreter; the same installed packages give the same bytes (no timestamp;
the serial number is derived from the content). ``identify`` is what ``doctor``, ``describe`` and the training summary
say of the image a job runs: the reference the job's spec passed (TRAINER_IMAGE, with its digest) and the document's
sha256.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import sysconfig
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from entrypoint.cluster.environments.settings import DEFAULT_SBOM

SPEC_VERSION = "1.5"
SBOM_PATH = DEFAULT_SBOM  # where every image keeps its document (docs/images.md; TRAINER_SBOM names another)
DPKG_STATUS = Path("/var/lib/dpkg/status")
DOC_DIR = Path("/usr/share/doc")
OS_RELEASE = Path("/etc/os-release")
TOOL = "python -m entrypoint sbom"
PROPERTY = "trainer:"  # the prefix of this document's own properties (CycloneDX: the author's namespace)
SOURCE = PROPERTY + "source-package"  # a deb's source package, when it is not the binary's name
SOURCE_VERSION = PROPERTY + "source-version"  # ... and its version, when it is not the binary's
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_SEPARATORS = re.compile(r"[-_.]+")


@dataclass(frozen=True)
class Component:
    """One installed package as the document lists it."""

    kind: str  # deb | pypi
    name: str
    version: str
    arch: str = ""  # a deb's architecture
    source: str = ""  # a deb's source package ("" when it is the binary's name)
    source_version: str = ""  # ... and its version ("" when it is the binary's)
    licenses: tuple[str, ...] = ()  # licence names (Debian's short names, classifiers' names)
    expression: str = ""  # an SPDX licence expression (License-Expression), instead of ``licenses``
    distro: tuple[str, str] = ("", "")  # a deb's distribution: os-release ID and VERSION_ID

    def purl(self) -> str:
        """The package URL (https://github.com/package-url/purl-spec): ``pkg:pypi/numpy@2.4.6``,
        ``pkg:deb/debian/libc6@2.36-9?arch=amd64&distro=debian-12``."""
        if self.kind == "pypi":
            return f"pkg:pypi/{normalize(self.name)}@{quote(self.version, safe='.!-_')}"
        qualifiers = [f"arch={self.arch}"] if self.arch else []
        if self.distro[0]:
            qualifiers.append(f"distro={self.distro[0]}-{self.distro[1]}")
        if self.source:
            qualifiers.append(f"upstream={quote(self.source, safe='.-_')}")
        query = f"?{'&'.join(qualifiers)}" if qualifiers else ""
        return f"pkg:deb/{self.distro[0] or 'debian'}/{self.name}@{quote(self.version, safe='.~-_')}{query}"

    def to_cyclonedx(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "library", "bom-ref": self.purl(), "name": self.name, "version": self.version,
                               "purl": self.purl()}
        if self.expression:
            out["licenses"] = [{"expression": self.expression}]
        elif self.licenses:
            out["licenses"] = [{"license": {"name": name}} for name in self.licenses]
        properties = [(SOURCE, self.source), (SOURCE_VERSION, self.source_version)]
        if any(value for _, value in properties):
            out["properties"] = [{"name": k, "value": v} for k, v in properties if v]
        return out


def normalize(name: str) -> str:
    """A Python project's name as PyPI compares them (PEP 503): ``Scikit_Learn`` -> ``scikit-learn``."""
    return _SEPARATORS.sub("-", name).lower()


# ---- the OS packages ------------------------------------------------------------------------------

def paragraphs(text: str) -> Iterable[dict[str, str]]:
    """The stanzas of a deb822 file (dpkg's status database, a DEP-5 copyright file): field -> its first line."""
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue  # a continuation line
            key, _, value = line.partition(":")
            fields.setdefault(key.strip().lower(), value.strip())
        if fields:
            yield fields


def os_release(path: Path = OS_RELEASE) -> dict[str, str]:
    """``/etc/os-release`` as a dict (ID, VERSION_ID, VERSION, PRETTY_NAME...)."""
    out: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            key, eq, value = line.partition("=")
            if eq:
                out[key.strip()] = value.strip().strip('"')
    return out


def deb_licenses(package: str, doc_dir: Path = DOC_DIR) -> tuple[str, ...]:
    """The licences a machine-readable (DEP-5) copyright file names: its ``License:`` fields' short names."""
    try:
        text = (doc_dir / package / "copyright").read_text(errors="replace")
    except OSError:
        return ()
    if not text.lstrip().lower().startswith("format:"):
        return ()  # free-form copyright text: no licence names to read
    return tuple(dict.fromkeys(s["license"] for s in paragraphs(text) if s.get("license")))


def deb_packages(status: Path = DPKG_STATUS, doc_dir: Path = DOC_DIR,
                 release: dict[str, str] | None = None) -> list[Component]:
    """Every package dpkg's status database says is installed (``install ok installed``, ``hold ok installed``)."""
    if not status.is_file():
        return []
    distro = release if release is not None else os_release()
    found = []
    for stanza in paragraphs(status.read_text(errors="replace")):
        words = stanza.get("status", "").split()
        if len(words) != 3 or words[2] != "installed" or "package" not in stanza:
            continue
        name, version = stanza["package"], stanza.get("version", "")
        source, _, source_version = stanza.get("source", "").partition(" ")
        source_version = source_version.strip().strip("()")
        found.append(Component(
            "deb", name, version, arch=stanza.get("architecture", ""), source=source if source != name else "",
            source_version=source_version if source_version not in ("", version) else "",
            licenses=deb_licenses(name, doc_dir), distro=(distro.get("ID", ""), distro.get("VERSION_ID", ""))))
    return found


# ---- the interpreter's Python packages ----------------------------------------------------------

def python_license(metadata: Any) -> tuple[tuple[str, ...], str]:
    """(licence names, SPDX expression) a distribution's metadata declares, the most precise source first."""
    expression = (metadata.get("License-Expression") or "").strip()
    if expression:
        return (), expression
    classifiers = [c.split("::")[-1].strip() for c in metadata.get_all("Classifier") or []
                   if c.startswith("License ::") and c.count("::") >= 2]
    if classifiers:
        return tuple(dict.fromkeys(classifiers)), ""
    text = (metadata.get("License") or "").strip()
    if text and "\n" not in text and len(text) <= 100 and text.upper() != "UNKNOWN":
        return (text,), ""
    return (), ""


def site_packages() -> list[str]:
    """This interpreter's own package directories (in a venv, the venv's; never ``PYTHONPATH``'s)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(p for p in (paths["purelib"], paths["platlib"]) if Path(p).is_dir()))


def python_packages(paths: list[str] | None = None) -> list[Component]:
    """Every distribution installed in ``paths`` (default: ``site_packages()``), once each (the first on the path)."""
    found: dict[str, Component] = {}
    for dist in importlib.metadata.distributions(path=paths if paths is not None else site_packages()):
        name = dist.name  # the metadata's Name (None for a broken dist-info)
        if not name or normalize(name) in found:
            continue
        licenses, expression = python_license(dist.metadata)
        found[normalize(name)] = Component("pypi", name, dist.version, licenses=licenses, expression=expression)
    return list(found.values())


# ---- the document ------------------------------------------------------------------------------

def document(components: list[Component], release: dict[str, str], properties: dict[str, str]) -> dict[str, Any]:
    """The CycloneDX document: the OS, then every package by kind and name; a serial number from the content."""
    ordered = sorted(components, key=lambda c: (c.kind, normalize(c.name), c.arch))
    listed: list[dict[str, Any]] = []
    if release.get("ID"):
        listed.append({"type": "operating-system", "bom-ref": f"os:{release['ID']}-{release.get('VERSION_ID', '')}",
                       "name": release["ID"], "version": release.get("VERSION_ID", ""),
                       "description": release.get("PRETTY_NAME", "")})
    listed += [c.to_cyclonedx() for c in ordered]
    body: dict[str, Any] = {
        "version": 1,
        "metadata": {"tools": {"components": [{"type": "application", "name": TOOL}]},
                     "component": {"type": "container", "bom-ref": "image",
                                   "name": f"trainer-{properties.get('framework') or 'image'}"},
                     "properties": [{"name": PROPERTY + k, "value": v} for k, v in sorted(properties.items()) if v]},
        "components": listed,
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return {"bomFormat": "CycloneDX", "specVersion": SPEC_VERSION, "serialNumber": f"urn:uuid:{uuid.UUID(digest[:32])}",
            **body}


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def write(out: Path, properties: dict[str, str]) -> dict[str, Any]:
    """Inventory this system and this interpreter's packages into ``out`` (world-readable)."""
    release = os_release()
    doc = document([*deb_packages(release=release), *python_packages()], release, properties)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(doc))
    out.chmod(0o644)
    return doc


# ---- reading a document ------------------------------------------------------------------------

def read(path: Path) -> dict[str, Any]:
    """A CycloneDX document; ValueError naming what is wrong when it is not one."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable JSON document ({exc})") from None
    if not isinstance(doc, dict) or doc.get("bomFormat") != "CycloneDX" or not isinstance(doc.get("components"),
                                                                                             list):
        raise ValueError(f"{path}: not a CycloneDX document (bomFormat, components)")
    return doc


def packages(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The document's package components (the operating system's own aside)."""
    return [c for c in doc["components"] if isinstance(c, dict) and str(c.get("purl", "")).startswith("pkg:")]


def kind_of(component: dict[str, Any]) -> str:
    """``deb`` or ``pypi``: its package URL's type."""
    return str(component.get("purl", "")).removeprefix("pkg:").split("/", 1)[0]


def inventory(doc: dict[str, Any]) -> dict[str, set[tuple[str, ...]]]:
    """What the document lists, comparable with what a container reports: ``{"deb": {(name, version, arch)},
    "pypi": {(normalized name, version)}}``."""
    out: dict[str, set[tuple[str, ...]]] = {"deb": set(), "pypi": set()}
    for component in packages(doc):
        kind = kind_of(component)
        if kind == "deb":
            arch = re.search(r"[?&]arch=([^&]+)", component["purl"])
            out["deb"].add((component["name"], component["version"], arch[1] if arch else ""))
        elif kind == "pypi":
            out["pypi"].add((normalize(component["name"]), component["version"]))
    return out


@dataclass(frozen=True)
class ImageIdentity:
    """What a job knows of the image it runs: the reference its spec passed (TRAINER_IMAGE) and its digest, and the
    image's bill of materials (its path, the sha256 of its bytes, its package count). Empty strings: not known."""

    reference: str = ""
    digest: str = ""  # sha256:... when the reference is pinned (NAME@sha256:...)
    sbom: str = ""  # the document's path, when the image has one
    sbom_sha256: str = ""
    packages: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        """One line: the digest the job ran (or why it is not known) and the document's hash."""
        if self.digest:
            ran = f"{self.reference} (digest {self.digest}, from the job's spec)"
        elif self.reference:
            ran = f"{self.reference} (by tag: no digest pinned; `job ... --pin` writes one)"
        else:
            ran = "reference unknown (TRAINER_IMAGE unset: `job ... --image NAME@sha256:...` or --pin sets it)"
        sbom = (f"bill of materials {self.sbom} sha256:{self.sbom_sha256} ({self.packages} packages)"
                if self.sbom_sha256 else "no bill of materials in this image")
        return f"{ran}; {sbom}"


def identify(reference: str | None, sbom_path: str) -> ImageIdentity:
    """The image a job runs: the reference and digest its spec passed, and the document at ``sbom_path`` if any (an
    unreadable document counts as none; its hash is of its bytes, as ``sha256sum`` prints it)."""
    reference = (reference or "").strip()
    digest = reference.rpartition("@")[2] if "@" in reference else ""
    digest = digest if DIGEST.fullmatch(digest) else ""
    path = Path(sbom_path)
    try:
        data = path.read_bytes()
        count = len(packages(json.loads(data)))
    except (OSError, ValueError, TypeError, KeyError):
        return ImageIdentity(reference, digest)
    return ImageIdentity(reference, digest, str(path), hashlib.sha256(data).hexdigest(), count)


def summary(path: Path) -> str:
    """One line: where, the sha256 of its bytes, how many packages of each kind, and how many name a licence."""
    doc = read(path)
    listed = packages(doc)
    counts = {kind: sum(kind_of(c) == kind for c in listed) for kind in ("deb", "pypi")}
    licensed = sum(bool(c.get("licenses")) for c in listed)
    return (f"{path}: sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}, {counts['deb']} OS packages, "
            f"{counts['pypi']} Python packages, {licensed} of {len(listed)} with a licence")
