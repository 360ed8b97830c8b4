"""The hooks loop's checkpoint policy: what a save holds besides the tensors, which checkpoint a resume takes, the
position and random streams it restores, and what that cost.

What a save holds of the model and who writes it, and how the ranks pick and load a checkpoint, is the parallel
layout's checkpoint format (``formats.py``: the chief alone, ``state.pt``, for DDP, Horovod and one process; every rank
its shards for FSDP and HSDP). The policy is the same for both: resume takes the job's own newest committed checkpoint
that verifies and loads, of either format, at any world size (``--resume-from`` while the job has none); the
position, scheduler, history and every rank's random streams come back with it; what the failure before it cost is
learned from the job's failure records (``lost_work``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.lifecycle import lost_work
from entrypoint.outputs import checkpoints
from entrypoint.outputs.storage import Location
from entrypoint.planning.plan import Plan
from entrypoint.pytorch import state as rng
from entrypoint.pytorch.checkpoints.checkpoint_io import BackgroundWriter
from entrypoint.pytorch.checkpoints.formats import CheckpointFormat, Picked, replicated_payload
from entrypoint.pytorch.checkpoints.sharded_io import HostCopy
from entrypoint.pytorch.defaults import HookContext
from entrypoint.pytorch.launch.collectives import Collectives
from entrypoint.pytorch.state import TrainState

log = logging.getLogger("entrypoint.pytorch")


def extra(state: TrainState, world_size: int) -> dict[str, Any]:
    """Everything but the model's and optimizer's tensors: position, history, scheduler, world size."""
    return {
        "scheduler": state.scheduler.state_dict() if state.scheduler is not None else None,
        "step": state.step, "epoch": state.epoch, "batch": state.batch, "sample": state.sample,
        "world_size": world_size, "history": state.history, "recoveries": state.recoveries,
        "metrics": state.metrics, "skipped": state.skipped,
    }


def live_state(state: TrainState, world_size: int) -> dict[str, Any]:
    """Everything a rank needs to continue from a replicated ``state`` (sent live to a healed rank)."""
    return {**replicated_payload(state.model, state.optimizer), **extra(state, world_size)}


class LoopCheckpoints:
    """Saves through the layout's checkpoint format and resumes every rank from the chief's choice."""

    def __init__(self, plan: Plan, comm: Collectives, ctx: HookContext, layout_format: CheckpointFormat,
                 batch_size: int) -> None:
        self.plan, self.comm, self.ctx, self.format = plan, comm, ctx, layout_format
        self.batch_size = batch_size  # per rank (to read an older checkpoint's position)

    @property
    def io(self) -> BackgroundWriter:
        """The format's writer (``wait``, ``check``, the seconds it blocked and wrote)."""
        return self.format.io

    def close(self) -> None:
        """The write in flight committed, the writer's buffers released (the training's end)."""
        self.format.close()

    def save(self, state: TrainState, alone: bool = False, host: HostCopy | None = None) -> None:
        """Every rank gives its RNG state; the format's writers save (the chief, or every rank its shards).
        ``alone``: the chief of a replicated model saves with no collective (a peer may be inside one, or gone),
        with only its own RNG state (every step reseeds every generator: ``state.reseed``). ``host``: a host copy
        of this state being made (FSDP's snapshot) that the shards are written from, instead of a copy of their
        own."""
        if alone:
            rngs = [rng.rng_state() if r == self.ctx.rank else None for r in range(self.ctx.world_size)]
        else:
            rngs = self.comm.gather_object(rng.rng_state())
        state.saved_step = state.step
        path = checkpoints.checkpoint_path(self.ctx.checkpoint_dir, state.step)
        meta = {"step": state.step, "epoch": state.epoch, "batch": state.batch, "sample": state.sample,
                "framework": self.plan.framework, "reached_at": lost_work.reached_at(),
                "world_size": self.ctx.world_size, "sharded": self.format.sharded}
        self.format.save(path, state, {**extra(state, self.ctx.world_size), "rng": rngs}, meta, host)

    def resume(self, state: TrainState) -> bool:
        """Resume from the chief's pick (the newest checkpoint that verifies and loads), picked and loaded as the
        format's protocol says, and learn what it cost; whether one was loaded (the same answer on every rank)."""
        picked = self.format.resume(self.comm, lambda attempt, check: self._pick(state, attempt, check),
                                    lambda path: self.load(path, state))
        if picked.error is not None:
            raise ConfigError(*picked.error)
        if picked.path is None:
            return False
        log.info("resumed from %s at step %d (epoch %d, batch %d)", picked.path, state.step, state.epoch, state.batch)
        if picked.cost is not None:
            state.recoveries.append(picked.cost)
            log.info("%s", lost_work.Recovery(**picked.cost).line())
        return True

    def _pick(self, state: TrainState, attempt: Callable[[Location], None],
              check: Callable[[Location], None] | None) -> Picked:
        """The chief: the job's own newest committed checkpoint that ``attempt`` loads into ``state`` (``--resume-from``
        while it has none), and what resuming there cost since its step was reached; or why none can be."""
        try:
            found = checkpoints.load_newest(self.ctx.checkpoint_dir, self.plan.options.resume_from, attempt,
                                            self.io.retention, check=check)
        except ConfigError as exc:
            return Picked(error=(exc.source, exc.problem))
        if found is None:
            return Picked()
        reached = checkpoints.read_marker(found[0]).get("reached_at")
        lost = lost_work.after_resume(self.plan.outputs.job_dir, state.step, reached)
        return Picked(str(found[0]), cost=lost.to_dict() if lost else None)

    def load(self, path: Location, state: TrainState) -> None:
        """A committed checkpoint of either format into ``state``, through the format (this rank's RNG too, at the
        same world size)."""
        saved = self.format.load(path, state)
        adopt_position(state, saved, self.batch_size * saved.get("world_size", self.ctx.world_size))
        state.saved_step = state.step
        saved_world, rngs = saved.get("world_size"), saved.get("rng") or []
        if saved_world == self.ctx.world_size and len(rngs) > self.ctx.rank:
            if rngs[self.ctx.rank] is not None:  # None: committed by the chief alone, on a stop outside a step
                rng.set_rng_state(rngs[self.ctx.rank])
        elif saved_world and self.ctx.is_chief:
            log.info("resharded from world %s to %d: %s of epoch %d's samples done, the rest shared by %d ranks",
                     saved_world, self.ctx.world_size, state.sample, state.epoch + 1, self.ctx.world_size)


def adopt(state: TrainState, saved: dict[str, Any]) -> None:
    """Make ``state`` the replicated one ``saved`` describes (the chief's state sent live to a healed rank)."""
    state.model.load_state_dict(saved["model"])
    state.optimizer.load_state_dict(saved["optimizer"])
    adopt_position(state, saved, 0)


def adopt_position(state: TrainState, saved: dict[str, Any], samples_per_step: int) -> None:
    """Position, scheduler, history and what recoveries cost, from a checkpoint's (or the chief's) state.

    ``samples_per_step`` is what the saving job consumed per step: an older checkpoint gives only its batches.
    """
    if state.scheduler is not None and saved.get("scheduler") is not None:
        state.scheduler.load_state_dict(saved["scheduler"])
    state.step, state.epoch, state.batch = saved["step"], saved["epoch"], saved["batch"]
    state.sample = int(saved.get("sample", saved["batch"] * samples_per_step))
    state.history = dict(saved.get("history") or {})
    state.recoveries = list(saved.get("recoveries") or [])
    state.metrics = dict(saved.get("metrics") or {})
    state.skipped = list(saved.get("skipped") or [])
