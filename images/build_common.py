"""What every step of the local CPU builds shares (images/local_build.py and its modules): the repository,
the image names, the one-line failure and the log line.

Standard library only, like the rest of the local build: the container tests (tests/containers/) load these
modules for the same settings.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Every image is a folder with a Dockerfile and an image.toml (images/<name>/; catalog.py reads them): the one list of
# images, which images.mk, cloudbuild.yaml and the image tests derive the same way.
IMAGES = tuple(sorted(p.parent.name for p in (ROOT / "images").glob("*/Dockerfile")))
VARIANTS = ("cpu", "gpu")  # make image-test builds the CPU variants (and runs them); make image-test-gpu the GPU ones
INSTALL = "apt-get install -y podman runc mmdebstrap"


class Failure(Exception):
    """Something failed: the message says what, and what to do (one line)."""


def log(message: str) -> None:
    print(f"local_build: {message}", flush=True)


def is_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def cache_dir() -> Path:
    """The local builds' own cache on this machine (XDG_CACHE_HOME, else ~/.cache): Horovod's wheels, build records."""
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "trainer-images"


def image_ref(image: str, variant: str = "cpu") -> str:
    """The local tag of an image's variant."""
    return f"localhost/trainer-{image}:{variant}"
