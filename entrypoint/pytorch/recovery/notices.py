"""The platform's advance notice in the hooks loop: each node hears it, every rank saves at the same step.

Every node's metadata server speaks for its own VM, so each node's training process at local rank 0 watches it
(``lifecycle/watch/notice.py``). A notice it hears goes into the next per-step vote (``vote.py``: two more integers,
still one all-reduce; between evaluation batches too), so every rank learns of it at the same step, wherever it was
heard; there ``StepGuard`` commits a checkpoint of that step at once (outside ``--checkpoint-every``), once per
notice, and training goes on until the signal (whose own save may then be cut short by the grace period without
losing more than the steps since the notice).

At start, the chief warns when the last save took longer than ``--grace-period`` (the checkpoint resumed from, else
the first one this run commits: its marker says when its step was reached and when it was committed).
"""

from __future__ import annotations

import logging

from entrypoint.cluster.environments.settings import metadata_host
from entrypoint.lifecycle.watch import notice
from entrypoint.lifecycle.watch.notice import NoticeWatcher
from entrypoint.outputs import checkpoints
from entrypoint.planning.plan import Plan
from entrypoint.pytorch.defaults import HookContext
from entrypoint.pytorch.recovery.vote import NO_NOTICE, StepVerdict

log = logging.getLogger("entrypoint.pytorch")


class AdvanceNotice:
    """This process's watcher (local rank 0 of each node), its notices for the vote, and the grace-period check."""

    def __init__(self, plan: Plan, ctx: HookContext) -> None:
        self.plan, self.ctx = plan, ctx
        self.watcher = NoticeWatcher(metadata_host()) if plan.placed.local_rank == 0 else None
        self.heard: notice.Notice | None = None  # the last notice this process heard (its words for the log)
        self._first_save: int | None = None  # the step of the first checkpoint this run saved
        self._grace_checked = False

    def start(self) -> None:
        """Watch in the background (a node without a metadata server: nothing, no log line)."""
        if self.watcher is not None:
            self.watcher.start()

    def stop(self) -> None:
        """Stop watching."""
        if self.watcher is not None:
            self.watcher.stop()

    def for_vote(self) -> tuple[int, int]:
        """A notice heard since the last vote, as the vote's (preempted, maintenance) flags; each notice once."""
        heard = self.watcher.take() if self.watcher is not None else None
        if heard is None:
            return NO_NOTICE
        self.heard = heard
        log.warning("advance notice from the platform: %s on %s: every rank commits a checkpoint at the next step "
                    "boundary (or evaluation batch), and training goes on until the signal", heard,
                    self.plan.topology.replica_name)
        return (1, 0) if heard.source == notice.PREEMPTED else (0, 1)

    def committed(self, verdict: StepVerdict, step: int) -> str:
        """The chief's line once the checkpoint of ``step`` that ``verdict``'s notice asked for is committed."""
        own = self.heard
        if own is not None and verdict.notices == 1:
            what = str(own)
        else:
            kinds = [f"preempted ({notice.PREEMPTED})"] if verdict.preempted else []
            kinds += [f"host maintenance ({notice.MAINTENANCE})"] if verdict.maintenance else []
            nodes = "node" if verdict.notices == 1 else "nodes"
            what = f"{' and '.join(kinds)} on {verdict.notices} {nodes}"
        return (f"advance notice from the platform: {what}: checkpoint of step {step} committed; training goes on "
                "until the signal")

    # ---- the grace period ---------------------------------------------------------------------
    def saved(self, step: int) -> None:
        """A checkpoint of ``step`` was saved (its write may still be in flight)."""
        if self._first_save is None:
            self._first_save = step

    def after_step(self, saved_step: int, written_seconds: float) -> None:
        """Check the last save's time once: the checkpoint resumed from (``saved_step`` before this run saved any),
        else this run's first, once written (the writer's ``write_seconds`` grew)."""
        if self._grace_checked:
            return
        if self._first_save is None and saved_step >= 0:
            self._check(saved_step)
        elif self._first_save is not None and written_seconds > 0:
            self._check(self._first_save)

    def _check(self, step: int) -> None:
        self._grace_checked = True
        if not self.ctx.is_chief:
            return
        path = checkpoints.checkpoint_path(self.ctx.checkpoint_dir, step)
        seconds = notice.save_seconds(path)  # None: pruned already, or resumed from another job's (--resume-from)
        warning = notice.grace_warning(path.name, seconds, self.plan.options.grace_period) if seconds else None
        if warning:
            log.warning("%s", warning)
