"""After a lost peer the survivors let go of their data-parallel wrapper: a DDP's is collected at once (its hooks
hold the broken group), a sharded model (its own wrapper) costs no full collection (``survivors.drop_wrapper``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.pytorch

from entrypoint.pytorch.recovery import survivors  # noqa: E402


def test_a_ddp_wrapper_is_collected_and_a_sharded_model_skips_the_collection(monkeypatch: Any) -> None:
    collected: list[int] = []

    def collect(*_args: Any) -> int:
        collected.append(1)
        return 0

    monkeypatch.setattr(survivors.gc, "collect", collect)
    model = object()
    ddp = SimpleNamespace(model=model, wrapped=object())
    assert survivors.drop_wrapper(ddp) is True  # type: ignore[arg-type]
    assert ddp.wrapped is None and collected == [1]
    sharded = SimpleNamespace(model=model, wrapped=model)
    assert survivors.drop_wrapper(sharded) is False  # type: ignore[arg-type]
    assert sharded.wrapped is None and collected == [1]
    assert survivors.drop_wrapper(sharded) is False and collected == [1]  # type: ignore[arg-type]  # none left
