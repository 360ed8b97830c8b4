"""The hooks loop's checkpoints: what a save holds, which checkpoint a resume takes, and what that cost."""

from __future__ import annotations

import logging
from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.lifecycle import lost_work
from entrypoint.outputs import checkpoints, storage
from entrypoint.outputs.storage import Location
from entrypoint.planning.plan import Plan
from entrypoint.pytorch import state as rng
from entrypoint.pytorch.collectives import Collectives
from entrypoint.pytorch.defaults import HookContext
from entrypoint.pytorch.state import TrainState

log = logging.getLogger("entrypoint.pytorch")


class LoopCheckpoints:
    """Saves through the checkpoint I/O seam (chief only) and resumes every rank from the chief's choice."""

    def __init__(self, plan: Plan, comm: Collectives, ctx: HookContext, io: checkpoints.CheckpointWriter) -> None:
        self.plan, self.comm, self.ctx, self.io = plan, comm, ctx, io

    def payload(self, state: TrainState) -> dict[str, Any]:
        """Everything a rank needs to continue from ``state`` (the chief's, in a checkpoint or sent live)."""
        return {
            "model": state.model.state_dict(), "optimizer": state.optimizer.state_dict(),
            "scheduler": state.scheduler.state_dict() if state.scheduler is not None else None,
            "step": state.step, "epoch": state.epoch, "batch": state.batch, "world_size": self.ctx.world_size,
            "history": state.history, "recoveries": state.recoveries, "metrics": state.metrics,
            "skipped": state.skipped,
        }

    def save(self, state: TrainState) -> None:
        """Every rank gives its RNG state; the chief hands the full state to the checkpoint I/O."""
        rngs = self.comm.gather_object(rng.rng_state())
        state.saved_step = state.step
        if not self.ctx.is_chief:
            return
        meta = {"step": state.step, "epoch": state.epoch, "batch": state.batch, "framework": self.plan.framework,
                "reached_at": lost_work.reached_at()}
        self.io.save(checkpoints.checkpoint_path(self.ctx.checkpoint_dir, state.step),
                     {**self.payload(state), "rng": rngs}, meta)

    def resume(self, state: TrainState) -> None:
        """The chief picks the checkpoint (the newest that verifies and loads) and tells every rank what it cost."""
        choice: tuple[str | None, tuple[str, str] | None, dict[str, Any] | None] = (None, None, None)
        if self.ctx.is_chief:
            try:
                found = checkpoints.load_newest(self.ctx.checkpoint_dir, self.plan.options.resume_from,
                                                lambda path: self.load(path, state), self.io.retention)
                lost = None
                if found is not None:
                    reached = checkpoints.read_marker(found[0]).get("reached_at")
                    lost = lost_work.after_resume(self.plan.outputs.job_dir, state.step, reached)
                choice = (str(found[0]) if found else None, None, lost.to_dict() if lost else None)
            except ConfigError as exc:
                choice = (None, (exc.source, exc.problem), None)
        path_text, error, cost = self.comm.broadcast_object(choice)
        if error is not None:
            raise ConfigError(*error)
        if path_text is None:
            return
        if not self.ctx.is_chief:
            self.load(storage.path(path_text), state)
        log.info("resumed from %s at step %d (epoch %d, batch %d)", path_text, state.step, state.epoch, state.batch)
        if cost is not None:
            state.recoveries.append(cost)
            log.info("%s", lost_work.Recovery(**cost).line())

    def load(self, path: Location, state: TrainState) -> None:
        """A committed checkpoint into ``state`` (this rank's RNG too, when the world size is the same)."""
        saved = self.io.load(path, self.ctx.device)
        adopt(state, saved)
        state.saved_step = state.step
        if saved.get("world_size") == self.ctx.world_size and saved.get("rng"):
            rng.set_rng_state(saved["rng"][self.ctx.rank])


def adopt(state: TrainState, saved: dict[str, Any]) -> None:
    """Make ``state`` the one ``saved`` describes (a checkpoint's payload, or the chief's sent live)."""
    state.model.load_state_dict(saved["model"])
    state.optimizer.load_state_dict(saved["optimizer"])
    if state.scheduler is not None and saved.get("scheduler") is not None:
        state.scheduler.load_state_dict(saved["scheduler"])
    state.step, state.epoch, state.batch = saved["step"], saved["epoch"], saved["batch"]
    state.history = dict(saved.get("history") or {})
    state.recoveries = list(saved.get("recoveries") or [])
    state.metrics = dict(saved.get("metrics") or {})
    state.skipped = list(saved.get("skipped") or [])
