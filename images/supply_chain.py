"""What a local build records of the image it made, and the vulnerability gate it runs on it (docs/images.md).

- The image's bill of materials (``/usr/share/trainer/sbom.cdx.json`` in the image, written by its Dockerfile's
  ``python -m entrypoint sbom write`` line) is copied beside the build's record:
  ``~/.cache/trainer-images/built/localhost_trainer-<image>_<variant>.cdx.json`` (XDG_CACHE_HOME is honoured);
- the record (``....json``) gains the image's digest as the engine names it (``localhost/trainer-<image>@sha256:...``,
  what ``python -m entrypoint job ... --pin`` of a local build reads), the document's path and its sha256;
- the gate (vuln_gate.py) judges the document against the advisory databases given (``--osv``; none by default:
  nothing can be downloaded here, so a local build checks the allowlist alone, and Cloud Build gives osv.dev's exports)
  and the allowlist (``images/vulnerability-allowlist.toml``). A failed gate fails the build, one line per finding.

Standard library only, imported by plain name like the rest of the local build.
"""

from __future__ import annotations

import datetime
import hashlib
import subprocess
from collections.abc import Sequence
from pathlib import Path

import build_inputs
import vuln_gate
from build_common import ROOT, Failure, image_ref, log
from container_engine import Engine

SBOM_IN_IMAGE = "/usr/share/trainer/sbom.cdx.json"  # entrypoint/outputs/sbom.py SBOM_PATH (a test keeps them equal)
ALLOWLIST = ROOT / vuln_gate.ALLOWLIST


def sbom_beside(ref: str) -> Path:
    """Where the bill of materials of the image ``ref`` is kept beside its build's record."""
    return build_inputs.record_path(ref).with_suffix(".cdx.json")


def image_digest(engine: Engine, ref: str) -> str:
    """The digest the engine names the image by (podman: its manifest's, ``name@sha256:...`` runs it); docker gives a
    locally built image none until it is pushed: empty then."""
    fmt = "{{.Digest}}" if engine.name == "podman" else "{{range .RepoDigests}}{{.}} {{end}}"
    proc = subprocess.run(engine.command("image", "inspect", "--format", fmt, ref), capture_output=True, text=True,
                          check=False)
    found = proc.stdout.split()[0].rpartition("@")[2] if proc.returncode == 0 and proc.stdout.split() else ""
    return found if found.startswith("sha256:") else ""


def keep_sbom(engine: Engine, image: str, variant: str) -> Path:
    """Copy the image's bill of materials beside its record (again only when the image changed), and record the
    image's digest and the document's sha256 there; a Failure when the image has none."""
    ref = image_ref(image, variant)
    path, image_id = sbom_beside(ref), engine.image_id(ref)
    record = build_inputs.read_record(ref)
    if path.is_file() and record.get("sbom_of") == image_id and record.get("sbom_sha256"):
        return path
    proc = subprocess.run(engine.command("run", "--rm", *engine.run_flags(), "--entrypoint", "cat", ref,
                                         SBOM_IN_IMAGE), capture_output=True, timeout=300, check=False)
    if proc.returncode != 0 or not proc.stdout:
        detail = (proc.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise Failure(f"{ref} has no bill of materials at {SBOM_IN_IMAGE} ({detail}): every Dockerfile writes it in "
                      f"its runtime stage (images/catalog.py SBOM_LINE)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(proc.stdout)
    digest = image_digest(engine, ref)
    build_inputs.annotate(ref, digest=digest, sbom=str(path), sbom_sha256=hashlib.sha256(proc.stdout).hexdigest(),
                          sbom_of=image_id or "")
    log(f"{ref}: bill of materials beside it: {path}{f'; digest {digest}' if digest else ''}")
    return path


def check(image: str, variant: str, sbom: Path, databases: Sequence[Path] = (), allowlist: Path = ALLOWLIST,
          today: datetime.date | None = None) -> vuln_gate.Verdict:
    """Run the gate on one image's document; a Failure (its lines, then what to do) when it does not pass."""
    try:
        verdict = vuln_gate.gate(sbom, list(databases), allowlist, image, today or datetime.date.today())
    except vuln_gate.GateError as exc:
        raise Failure(f"vulnerability gate: {exc}") from None
    lines = verdict.lines(str(allowlist.relative_to(ROOT) if allowlist.is_relative_to(ROOT) else allowlist))
    source = (f"{len(databases)} advisory database(s)" if databases else
              "no advisory database, the allowlist alone: Cloud Build gives osv.dev's")
    if not verdict.passed:
        for line in lines[:-1]:
            log(f"vulnerability gate: {image_ref(image, variant)}: {line}")
        raise Failure(f"vulnerability gate ({source}): {lines[-1]}")
    log(f"vulnerability gate ({source}): {lines[-1]}")
    return verdict
