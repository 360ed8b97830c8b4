"""The local base image, localhost/debian:bookworm: a Debian root file system made with mmdebstrap (no
registry can be pulled from), labelled with its recipe and date, and remade when either is out of date."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from build_common import INSTALL, Failure, log
from container_engine import Engine

# The local base: what mmdebstrap makes, and how long it is trusted before a refresh (security updates).
BASE_REF = "localhost/debian:bookworm"
BASE_PYTHON = "3.11"  # bookworm's python3.11 (the release base, Ubuntu 24.04, has 3.12)
BASE_SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
BASE_RECIPE = ("mmdebstrap", "--variant=minbase", "--include=ca-certificates", "bookworm")
BASE_MAX_AGE_DAYS = 30
BASE_LABEL = "org.trainer-images.base"  # "<recipe hash>-<UTC stamp>"; every image built on the base inherits it


def _recipe_hash() -> str:
    return hashlib.sha256("\n".join(BASE_RECIPE + BASE_SOURCES).encode()).hexdigest()[:12]


def base_label(engine: Engine) -> str | None:
    """The base image's label (recipe hash and stamp), or None when there is no base."""
    if not engine.exists(BASE_REF):
        return None
    label = engine.output("image", "inspect", "--format", f'{{{{index .Config.Labels "{BASE_LABEL}"}}}}', BASE_REF)
    return label.strip() or "unlabelled"


def _base_age_days(label: str) -> float | None:
    match = re.fullmatch(r"[0-9a-f]{12}-(\d{8}T\d{6}Z)", label)
    if not match:
        return None
    made = datetime.strptime(match.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    return (datetime.now(timezone.utc) - made).total_seconds() / 86400


def base_is_current(label: str | None) -> bool:
    if label is None or not label.startswith(_recipe_hash() + "-"):
        return False
    age = _base_age_days(label)
    return age is not None and age < BASE_MAX_AGE_DAYS


def remove_built_on(engine: Engine, label: str) -> None:
    """Remove every image (tags and layer cache) built on the base with this label."""
    ids = engine.output("images", "--all", "--quiet", "--filter", f"label={BASE_LABEL}={label}").split()
    if ids:
        subprocess.run(engine.command("rmi", "--force", *sorted(set(ids))), capture_output=True, check=False)


def ensure_base(engine: Engine) -> None:
    """Make localhost/debian:bookworm unless a current one exists (recipe unchanged, under a month old)."""
    old = base_label(engine)
    if base_is_current(old):
        log(f"base {BASE_REF} is current ({old})")
        return
    if not shutil.which("mmdebstrap"):
        raise Failure(f"mmdebstrap is needed to make the local base {BASE_REF}: {INSTALL}")
    why = "missing" if old is None else f"stale ({old}; refreshed every {BASE_MAX_AGE_DAYS} days or on a new recipe)"
    log(f"base {BASE_REF} {why}: bootstrapping Debian bookworm with mmdebstrap (about a minute)")
    stamp = f"{_recipe_hash()}-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"
    with tempfile.TemporaryDirectory(prefix="trainer-base-") as tmp:
        tarball = Path(tmp) / "base.tar"
        proc = subprocess.run([*BASE_RECIPE, "--quiet", str(tarball), *BASE_SOURCES], check=False)
        if proc.returncode != 0:
            raise Failure(f"mmdebstrap failed (exit {proc.returncode}): is http://deb.debian.org reachable? "
                          "See its output above")
        engine.output("import", "--change", f"LABEL {BASE_LABEL}={stamp}", str(tarball), BASE_REF, timeout=600)
    if old is not None and old != "unlabelled":
        remove_built_on(engine, old)  # its layers can never be reused: give the disk back
    log(f"base {BASE_REF} made ({stamp})")
