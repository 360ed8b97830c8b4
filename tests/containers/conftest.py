"""Fixtures of the container tests: the engine and the locally built images, or a clear skip (a failure in CI)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.containers.engine import JOB_TIMEOUT, common, engines, unavailable


@pytest.fixture(scope="session")
def engine() -> Any:
    """The engine `make image-test` built with (docker where `docker info` works, else podman). `make test`
    builds other images beside these tests, and a build committing a layer holds the storage lock that
    `podman info` waits for (past a minute on 2 busy cores): the tests wait for it as long as for a job."""
    found = engines.detect_engine(patience=JOB_TIMEOUT)
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
