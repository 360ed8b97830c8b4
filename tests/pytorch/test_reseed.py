"""The hooks loop's per-step seeding: the draws ``torch.manual_seed`` gives, without its per-call cost on CPU."""

from __future__ import annotations

import random
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # collected in every venv; these run where torch is
pytestmark = pytest.mark.pytorch

from entrypoint.pytorch.state import reseed  # noqa: E402


def mixed(seed: int, rank: int, step: int) -> int:
    return (seed * 1_000_003 + rank * 7_919 + step * 104_729) % (2**63 - 1)


def test_a_steps_draws_are_those_of_torch_manual_seed_of_seed_rank_and_step() -> None:
    reseed(3, 1, 7)
    ours = (torch.rand(4), random.random(), np.random.rand())
    torch.manual_seed(mixed(3, 1, 7))
    random.seed(mixed(3, 1, 7))
    np.random.seed(mixed(3, 1, 7) % (2**32))
    assert torch.equal(ours[0], torch.rand(4)) and ours[1:] == (random.random(), np.random.rand())
    reseed(3, 1, 8)
    assert not torch.equal(ours[0], torch.rand(4))  # another step, other draws


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.is_initialized(), reason="CUDA is initialized here")
def test_seeding_a_cpu_step_formats_no_stack_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.manual_seed queues a lazy seed for each device type not initialized, with a formatted stack trace:
    0.25 ms a step, more than a small model's whole step on CPU."""
    def formatted(*_args: object, **_kwargs: object) -> list[str]:
        raise AssertionError("a stack trace was formatted")

    monkeypatch.setattr(traceback, "format_stack", formatted)
    with pytest.raises(AssertionError, match="a stack trace was formatted"):
        torch.manual_seed(1)  # what the loop called before
    reseed(1, 0, 1)
