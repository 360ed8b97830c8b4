"""Fixtures of the container tests: the engine and the locally built images, or a clear skip (a failure in CI)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.containers.engine import common, engines, unavailable


@pytest.fixture(scope="session")
def engine() -> Any:
    """The engine `make image-test` built with (docker where `docker info` works, else podman)."""
    found = engines.detect_engine()
    if found is None:
        unavailable(f"no container engine: {common.INSTALL}, then `make image-test`")
    return found


@pytest.fixture(scope="session")
def built(engine: Any) -> Any:
    """``built(image)``: the image name, once its local CPU build exists."""

    def check(image: str) -> str:
        if not engine.exists(common.image_ref(image)):
            unavailable(f"{common.image_ref(image)} is not built: run `make image-test`")
        return image

    return check
