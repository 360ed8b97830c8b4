"""The hooks loop's checkpoints: what a save holds, which checkpoint a resume takes, and what that cost.

What a save holds and who writes it is the parallel layout's checkpoint format (``formats.py``): the chief alone
(``state.pt``: DDP, Horovod, one process), or every rank its shards (FSDP, HSDP). Resume takes the newest committed
checkpoint that verifies and loads, of either format, at any world size, through the format: the chief picks, and
for a collective format every rank takes part in each attempt (``dcp.load`` is a collective), so a checkpoint that
fails on any rank is skipped on all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from entrypoint.errors import ConfigError, Interrupted
from entrypoint.lifecycle import lost_work
from entrypoint.outputs import checkpoints, storage
from entrypoint.outputs.storage import Location
from entrypoint.planning.plan import Plan
from entrypoint.pytorch import state as rng
from entrypoint.pytorch.checkpoints.checkpoint_io import BackgroundWriter
from entrypoint.pytorch.checkpoints.formats import CheckpointFormat, replicated_payload
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

    def save(self, state: TrainState, alone: bool = False) -> None:
        """Every rank gives its RNG state; the format's writers save (the chief, or every rank its shards).
        ``alone``: the chief of a replicated model saves with no collective (a peer may be inside one, or gone),
        with only its own RNG state (every step reseeds every generator: ``state.reseed``)."""
        if alone:
            rngs = [rng.rng_state() if r == self.ctx.rank else None for r in range(self.ctx.world_size)]
        else:
            rngs = self.comm.gather_object(rng.rng_state())
        state.saved_step = state.step
        path = checkpoints.checkpoint_path(self.ctx.checkpoint_dir, state.step)
        meta = {"step": state.step, "epoch": state.epoch, "batch": state.batch, "sample": state.sample,
                "framework": self.plan.framework, "reached_at": lost_work.reached_at(),
                "world_size": self.ctx.world_size, "sharded": self.format.sharded}
        self.format.save(path, state, {**extra(state, self.ctx.world_size), "rng": rngs}, meta)

    def resume(self, state: TrainState) -> bool:
        """The chief picks the checkpoint (the newest that verifies and loads) and tells every rank what it cost;
        whether one was loaded (the same answer on every rank)."""
        collective = self.format.collective
        choice: tuple[str | None, tuple[str, str] | None, dict[str, Any] | None] = (None, None, None)
        if self.ctx.is_chief:
            try:
                found = checkpoints.load_newest(self.ctx.checkpoint_dir, self.plan.options.resume_from,
                                                self._loader(state), self.io.retention,
                                                check=(lambda _path: None) if collective else None)
                lost = None
                if found is not None:
                    reached = checkpoints.read_marker(found[0]).get("reached_at")
                    lost = lost_work.after_resume(self.plan.outputs.job_dir, state.step, reached)
                choice = (str(found[0]) if found else None, None, lost.to_dict() if lost else None)
            except ConfigError as exc:
                choice = (None, (exc.source, exc.problem), None)
            finally:
                if collective:
                    self.comm.broadcast_object(None)  # the others stop following the chief's attempts
        elif collective:
            self._follow(state)
        path_text, error, cost = self.comm.broadcast_object(choice)
        if error is not None:
            raise ConfigError(*error)
        if path_text is None:
            return False
        if not self.ctx.is_chief and not collective:
            self.load(storage.path(path_text), state)
        log.info("resumed from %s at step %d (epoch %d, batch %d)", path_text, state.step, state.epoch, state.batch)
        if cost is not None:
            state.recoveries.append(cost)
            log.info("%s", lost_work.Recovery(**cost).line())
        return True

    def _loader(self, state: TrainState) -> Callable[[Location], None]:
        """How the chief tries a candidate: alone (a replicated format), or with every rank (a collective one)."""
        if not self.format.collective:
            return lambda path: self.load(path, state)

        def attempt(path: Location) -> None:
            self.comm.broadcast_object(str(path))
            outcome = self._attempt(path, state)
            failed = [o for o in self.comm.gather_object(outcome) if o is not None]
            if failed:
                raise checkpoints.CheckpointError(failed[0])

        return attempt

    def _follow(self, state: TrainState) -> None:
        """A sharded model's other ranks: take part in every candidate the chief tries, until it says stop."""
        while (path_text := self.comm.broadcast_object(None)) is not None:
            self.comm.gather_object(self._attempt(storage.path(path_text), state))

    def _attempt(self, path: Location, state: TrainState) -> str | None:
        """Verify this rank's share of ``path``'s files, then (if every rank's share verified) load ``path`` into
        this rank's shards; None, or why it failed (every rank runs the same collectives)."""
        verified = [problem for problem in self.comm.gather_object(self._verify_share(path)) if problem]
        if verified:
            return verified[0]
        try:
            self.load(path, state)
        except BaseException as exc:  # torch.distributed.checkpoint's CheckpointException is a BaseException
            if isinstance(exc, (KeyboardInterrupt, SystemExit, Interrupted)):  # a stop is not a bad checkpoint
                raise
            return _why(exc)
        return None

    def _verify_share(self, path: Location) -> str | None:
        try:
            checkpoints.verify(path, share=(self.ctx.rank, self.ctx.world_size))
        except Exception as exc:
            return _why(exc)
        return None

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


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300]
    return text if isinstance(exc, checkpoints.CheckpointError) else f"{type(exc).__name__}: {text}"


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
