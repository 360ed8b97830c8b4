"""The per-step vote of the hooks loop: every rank learns at the same step whether to stop or to fail."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from entrypoint.lifecycle.signals import StopRequest
from entrypoint.pytorch.collectives import Collectives, Vote


@dataclass(frozen=True)
class StepVerdict:
    """What every rank learned about one step: whether any rank asked to stop, how many saw a NaN/inf loss."""

    step: int
    stop: bool
    nonfinite: int


class StepVote:
    """Every rank decides at the same step whether to stop or fail: one small all-reduce per step, overlapped.

    The vote started after step k (a stop request, a non-finite loss) is read after step k+1, so it costs no
    wait, and every rank reads the same sums at the same step: a signal that reached any node stops them
    all together. Before anything is saved, evaluated or exported the vote in flight is settled, so no
    checkpoint ever holds the state of a step whose loss was not finite.
    """

    def __init__(self, comm: Collectives, request: StopRequest, device: torch.device) -> None:
        self.comm, self.request, self.device = comm, request, device
        self._pending: tuple[int, Vote] | None = None

    def poll(self, step: int, loss: torch.Tensor | None) -> StepVerdict | None:
        """Read the previous step's vote (if any) and start this step's (``loss`` None: not checked here)."""
        verdict = self.drain()
        stop = torch.tensor([int(self.request.requested)], dtype=torch.int64, device=self.device)
        bad = nonfinite(loss) if loss is not None else torch.zeros(1, dtype=torch.int64, device=self.device)
        self._pending = (step, self.comm.start_vote(torch.cat([stop, bad])))
        return verdict

    def drain(self) -> StepVerdict | None:
        """Finish the vote in flight; its verdict (None when none was in flight)."""
        if self._pending is None:
            return None
        (step, vote), self._pending = self._pending, None
        stop, bad = vote.result()
        return StepVerdict(step, stop > 0, bad)


def nonfinite(loss: torch.Tensor) -> torch.Tensor:
    """1 (int64, on the loss's device, no host sync) when the loss is NaN or infinite, else 0."""
    return (~torch.isfinite(loss.detach())).reshape(-1)[:1].to(torch.int64)
