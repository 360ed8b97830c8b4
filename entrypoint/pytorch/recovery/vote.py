"""The per-step vote of the hooks loop: every rank learns at the same step whether to stop, fail or save now."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from entrypoint.lifecycle.signals import StopRequest
from entrypoint.pytorch.launch.collectives import Collectives, Vote

NO_NOTICE = (0, 0)


@dataclass(frozen=True)
class StepVerdict:
    """What every rank learned about one step: whether any rank asked to stop, how many saw a NaN/inf loss, and on
    how many nodes the platform gave an advance notice (a reclaim, host maintenance): save now."""

    step: int
    stop: bool
    nonfinite: int
    preempted: int = 0
    maintenance: int = 0
    joining: int = 0  # rank 0 saw a lost node's replacement announce itself: take it in at this step boundary

    @property
    def notices(self) -> int:
        """The nodes that heard an advance notice at this step."""
        return self.preempted + self.maintenance


class StepVote:
    """Every rank decides at the same step whether to stop, fail or save: one small all-reduce per step, overlapped.

    The vote started after step k (a stop request, a non-finite loss, an advance notice) is read after step k+1,
    so it costs no wait, and every rank reads the same sums at the same step: a signal that reached any node stops
    them all together, a notice any node heard makes them all save. Before anything is saved, evaluated or
    exported the vote in flight is settled, so no checkpoint ever holds the state of a step whose loss was not
    finite.
    """

    def __init__(self, comm: Collectives, request: StopRequest, device: torch.device,
                 joining: Callable[[], bool] = lambda: False) -> None:
        self.comm, self.request, self.device, self.joining = comm, request, device, joining
        self._pending: tuple[int, Vote] | None = None

    def poll(self, step: int, loss: torch.Tensor | None, notice: tuple[int, int] = NO_NOTICE) -> StepVerdict | None:
        """Read the previous step's vote (if any) and start this step's (``loss`` None: not checked here;
        ``notice``: whether this process heard a reclaim, host maintenance since its last vote)."""
        verdict = self.drain()
        flags = torch.tensor([int(self.request.requested), *notice, int(self.joining())], dtype=torch.int64,
                             device=self.device)
        bad = nonfinite(loss) if loss is not None else torch.zeros(1, dtype=torch.int64, device=self.device)
        self._pending = (step, self.comm.start_vote(torch.cat([flags[:1], bad, flags[1:]])))
        return verdict

    def drain(self) -> StepVerdict | None:
        """Finish the vote in flight; its verdict (None when none was in flight)."""
        if self._pending is None:
            return None
        (step, vote), self._pending = self._pending, None
        stop, bad, preempted, maintenance, joining = vote.result()
        return StepVerdict(step, stop > 0, bad, preempted, maintenance, joining)


def nonfinite(loss: torch.Tensor) -> torch.Tensor:
    """1 (int64, on the loss's device, no host sync) when the loss is NaN or infinite, else 0."""
    return (~torch.isfinite(loss.detach())).reshape(-1)[:1].to(torch.int64)
