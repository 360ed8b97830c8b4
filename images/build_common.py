"""What every step of the local CPU builds shares (images/local_build.py and its modules): the repository,
the image names, the one-line failure and the log line.

Standard library only, like the rest of the local build: the container tests (tests/containers/) load these
modules for the same settings.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Every image is a folder with a Dockerfile (images/<name>/Dockerfile): the one list of images, which
# images.mk, cloudbuild.yaml's test and the image tests derive the same way.
IMAGES = tuple(sorted(p.parent.name for p in (ROOT / "images").glob("*/Dockerfile")))
INSTALL = "apt-get install -y podman runc mmdebstrap"


class Failure(Exception):
    """Something failed: the message says what, and what to do (one line)."""


def log(message: str) -> None:
    print(f"local_build: {message}", flush=True)


def is_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def image_ref(image: str) -> str:
    """The local tag of an image's CPU variant."""
    return f"localhost/trainer-{image}:cpu"
