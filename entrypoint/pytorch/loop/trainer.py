"""The hooks-mode training loop the entrypoint owns: build, resume, for each epoch and batch a step, finish.

Shared by PyTorch (torch.distributed) and Horovod through ``Collectives``. The loop reads as training. The parallel
layout is decided once, after ``build_model`` (``layout.py``: a frozen value, read for its facts). What keeps each
step safe is the guard, in two parts: ``RunGuard`` from the first hook (stop signals in every phase, hangs, the
advance notice, the ledger's phases, the group and naming a lost peer: ``guard.py``) and ``StepGuard``, built with
the layout (the step vote, non-finite losses, saves and stops, survivors that keep training: ``steps.py``), which
the loop calls at the start, for each batch, before the update, after the step, around the evaluation, at the
epoch's end and at the finish. Checkpoints go through the layout's format (``formats.py``, asynchronous by default)
and a resumed run sees exactly the batches and random streams of an uninterrupted one (``data.py``, ``state.py``).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from entrypoint import failures
from entrypoint.errors import ConfigError
from entrypoint.options import DEFAULT_BATCH_SIZE, DEFAULT_EPOCHS
from entrypoint.outputs import storage
from entrypoint.outputs.hypertune import MetricReporter
from entrypoint.outputs.locations import ensure_writable, local_path
from entrypoint.outputs.progress import Progress
from entrypoint.outputs.summary import TrainingSummary, write_summary
from entrypoint.planning.plan import Plan
from entrypoint.planning.usercode import load_hooks, module_default, parse_user_args
from entrypoint.pytorch.checkpoints.checkpoint_io import LOAD_WITH
from entrypoint.pytorch.checkpoints.resume import LoopCheckpoints
from entrypoint.pytorch.defaults import HookContext, default_eval_step, default_loss, eval_step_from_loss
from entrypoint.pytorch.launch.collectives import Collectives, TorchDistributed
from entrypoint.pytorch.launch.membership import JobFinished, Membership
from entrypoint.pytorch.loop import compile_cache, hub_export, parallel, pretrained
from entrypoint.pytorch.loop.data import TrainBatches, to_device
from entrypoint.pytorch.loop.evaluation import check_evaluation_set, evaluate
from entrypoint.pytorch.loop.export import export_model
from entrypoint.pytorch.loop.layout import Layout, lay_out
from entrypoint.pytorch.recovery.guard import RunGuard, check_placement
from entrypoint.pytorch.recovery.steps import StepGuard
from entrypoint.pytorch.recovery.survivors import InPlace
from entrypoint.pytorch.state import TrainState, reseed

log = logging.getLogger("entrypoint.pytorch")
LOAD_HUB = ("transformers' AutoModel...from_pretrained(model_dir) (config.json, safetensors with an index past "
            f"max_shard_size); a checkpoint: {LOAD_WITH}")


class Trainer:
    """Runs the user's hooks under data parallelism with chief-only outputs."""

    def __init__(self, plan: Plan, comm: Collectives, failure_context: failures.FailureContext,
                 membership: Membership | None = None) -> None:
        options, topo, placed = plan.options, plan.topology, plan.placed
        self.plan, self.options, self.comm = plan, options, comm
        self.module = load_hooks(plan.require_code().target)
        self.args = parse_user_args(self.module, options.user_args)
        device = torch.device("cuda", placed.local_rank) if torch.cuda.is_available() else torch.device("cpu")
        out = plan.outputs
        self.ctx = HookContext(rank=placed.training_rank, world_size=placed.world_size, local_rank=placed.local_rank,
                               device=device, is_chief=placed.training_rank == 0,
                               model_dir=storage.path(local_path(out.model_dir)),
                               checkpoint_dir=storage.path(local_path(out.checkpoint_dir)),
                               tensorboard_dir=storage.path(local_path(out.tensorboard_dir)), trial=topo.trial)
        self.epochs = int(options.epochs or module_default(self.module, "epochs", DEFAULT_EPOCHS))
        self.batch_size = int(options.batch_size or module_default(self.module, "batch_size", DEFAULT_BATCH_SIZE))
        self.metric_name = options.hypertune_metric or getattr(self.module, "HYPERTUNE_METRIC", None)
        self.reporter = MetricReporter(self.ctx.is_chief, topo.trial, asked=options.hypertune_metric is not None)
        survivors = None
        if membership is not None:
            assert isinstance(comm, TorchDistributed), "survivors keep training over torch.distributed only"
            survivors = InPlace(membership, comm, plan, (topo.replica_name, socket.gethostname()))
        self.guard = RunGuard(plan, comm, self.ctx, failure_context, survivors)  # from the first hook on
        self.writer: Any = None
        self.layout: Layout  # decided once the model is built (``_build``)
        self.digests: dict[str, list[Any]] = {}
        self.hub = False  # exported as a transformers model (from_pretrained)
        if self.ctx.is_chief:  # before the hang watchdog starts; TensorBoard's own file layer (fsspec) as in the
            storage.tensorboard_through_fsspec()  # PyTorch image, never TensorFlow's where it is installed (Horovod)
            from torch.utils import tensorboard  # noqa: F401

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self) -> None:
        """Train for the configured epochs, resuming from the newest committed checkpoint that loads."""
        try:
            self._fit()
        except JobFinished as done:  # a replacement of a lost HSDP node that came after the training ended
            log.info("%s", done)

    def _fit(self) -> None:
        with self.guard.running():
            state, batches, eval_set, layout, steps = self._build()
            start_step, start_epoch = self._start(state, layout, steps)
            planned = self._planned_steps(state, batches)
            self.guard.record.total = planned
            self._announce(batches.steps_per_epoch)
            progress = Progress(planned, self.batch_size * self.ctx.world_size, start_step=state.step)
            started = time.time()
            for attempt in steps.attempts(state):  # once, unless a lost peer is replaced in place
                with attempt:
                    self._wrap(state, layout)
                    for epoch in range(state.epoch, self.epochs):
                        self._train_epoch(state, batches, epoch, progress, steps)
                        self._end_epoch(state, eval_set, epoch, layout, steps)
            steps.finishing(state)
            self._finish(state, layout, start_step, start_epoch, planned, time.time() - started)

    def _planned_steps(self, state: TrainState, batches: TrainBatches) -> int:
        """The step this run ends at: the rest of the current epoch (at this world size), then whole epochs."""
        if state.epoch >= self.epochs:
            return state.step
        later = (self.epochs - state.epoch - 1) * batches.steps_per_epoch
        return state.step + batches.steps_left(state.sample) + later

    def _build(self) -> tuple[TrainState, TrainBatches, Dataset[Any], Layout, StepGuard]:
        """The user's datasets, model and optimizer; the parallel layout (``layout.py``), decided once the model
        exists, and the step guard built with it; this rank's batches."""
        ctx, opts, phase = self.ctx, self.options, self.guard.doing
        if ctx.is_chief:
            phase("checking the output directories")
            ensure_writable([ctx.model_dir, ctx.checkpoint_dir, ctx.tensorboard_dir])
        torch.manual_seed(opts.seed)
        phase("building the datasets (build_datasets)")
        train_set, eval_set = self.module.build_datasets(self.args, ctx)
        check_evaluation_set(eval_set, ctx)
        torch.manual_seed(opts.seed)  # the model's first weights do not depend on what the datasets drew
        phase("building the model (build_model)")
        with pretrained.meta_parameters() if opts.init_from else nullcontext():  # its weights come after placing
            model = self.module.build_model(self.args, ctx)
        if self.guard.survivors is not None and self.guard.survivors.joining:  # a replacement imports what placing its
            parallel.preload(self.plan.strategy)  # model and its optimizer need before it is taken in, not after
        healing = self.guard.admit(model)  # a replacement joins the job in progress before placing its model
        phase("placing the model (sharding it, or moving it to its device)")
        self.compiled = compile_cache.load(self.plan, ctx, model, self.module)  # --compile's caches (job dir)
        survivors = self.guard.survivors.comm if self.guard.survivors is not None else None
        layout = self.layout = lay_out(model, self.plan, self.comm, ctx.device, self.compiled.on, survivors, healing)
        model = layout.model.shard(model, self._units())
        phase("building the optimizer")
        state = TrainState(model, *self._optimizer(model))
        batches = TrainBatches(train_set, self.batch_size, ctx.rank, ctx.world_size, opts.seed, self._workers(),
                               ctx.device.type == "cuda")
        if batches.steps_per_epoch == 0:
            raise ConfigError("--batch-size", f"{self.batch_size} x {ctx.world_size} replicas exceeds the training set")
        saver = LoopCheckpoints(self.plan, self.comm, ctx, layout.checkpoints, self.batch_size)
        if layout.peer_snapshots and self.guard.survivors is not None:  # FSDP: each rank's shards in a peer's memory
            self.guard.survivors.keep_snapshots(self.plan.placed.local_world_size, opts.timeout)
        elif opts.framework_option("snapshot_every") and ctx.is_chief:
            log.warning("--snapshot-every has no effect here: snapshots in peer memory are taken for FSDP across "
                        "nodes with --recovery in-place and --peer-snapshots on only")
        steps = StepGuard(self.guard, saver, layout.evaluates_in_lockstep, layout.survives_lost_peer,
                          layout.replica_size)
        return state, batches, eval_set, layout, steps

    def _units(self) -> Callable[[nn.Module], list[nn.Module]] | None:
        """The module's ``shard_units(model, ctx)`` hook, checked; None for the default units."""
        hook = getattr(self.module, "shard_units", None)
        if not callable(hook):
            return None
        return lambda model: parallel.named_units(model, hook(model, self.ctx))

    def _start(self, state: TrainState, layout: Layout, steps: StepGuard) -> tuple[int, int]:
        """Join the group; resume from the newest checkpoint (or, as a replacement, from a live replica's state)."""
        if steps.start(state, self._first_weights) is None:  # the group's first generation
            self.digests["init"] = self.comm.gather_object(layout.model.digest(state.model))
        else:  # a replacement: it does what the survivors do next, no more (collectives must pair up)
            self.digests.update(init=[], start=[])
        return state.step, state.epoch

    def _first_weights(self, state: TrainState) -> None:
        """No checkpoint to resume from: the first weights from ``--init-from`` (the job's own checkpoints win)."""
        if self.options.init_from:
            self._init_from(state)

    def _wrap(self, state: TrainState, layout: Layout) -> None:
        """Data parallelism over the (current) group: rank 0's parameters reach every rank."""
        if not self._fewer():  # again after an in-place recovery re-formed the group (with every rank)
            check_placement(self.plan.placed, self.comm)
        self.guard.doing("wrapping the model for data parallelism")
        state.wrapped, state.optimizer = layout.model.wrap(state.model, state.optimizer)
        self.digests.setdefault("start", self.comm.gather_object(layout.model.digest(state.model)))

    def _train_epoch(self, state: TrainState, batches: TrainBatches, epoch: int, progress: Progress,
                     steps: StepGuard) -> None:
        """An epoch's steps. A step is ten things, as nanoGPT's: batches, guard (``StepGuard``), state, precision (and
        random streams), loss, optimizer, backward, the agreed update, the progress report, the checkpoint schedule."""
        for batch in steps.batches(batches.epoch(epoch, state.sample), state):  # a slow batch does not hold a stop
            loss = self._step(state, batch, steps)
            state.advance(batches.samples_per_step)
            self._report(state, loss, epoch, progress)
            steps.after_step(state, loss, save=self._checkpoint_due(state, batches))
            self._snapshot(state, batches)
            self.compiled.after_step(state)  # the chief keeps --compile's caches in the job dir once they grew

    def _step(self, state: TrainState, batch: Any, steps: StepGuard) -> torch.Tensor:
        """One optimizer step (its update dropped where every rank agreed to skip it); its loss."""
        with self._precision(state.step + 1):
            loss = self._loss(state, batch)
        state.optimizer.zero_grad()  # set_to_none is the default (Horovod's optimizer takes no argument)
        loss.backward()
        self.layout.model.reduce_gradients(state.model)  # HSDP by node: across the replicas (``parallel.py``)
        if steps.agree_finite(state, loss):
            if self.options.clip_grad_norm:
                assert state.wrapped is not None
                torch.nn.utils.clip_grad_norm_(state.wrapped.parameters(), self.options.clip_grad_norm)
            state.optimizer.step()
        return loss

    def _fewer(self) -> bool:
        """Whether the group trains with fewer replicas now (HSDP's survivors, a lost node not back yet)."""
        survivors = self.guard.survivors
        return survivors is not None and survivors.membership.fewer

    def _precision(self, step: int) -> Any:
        """The step's random streams (reseeded from the seed, the rank and the step: ``state.reseed``) and autocast."""
        reseed(self.options.seed, self.ctx.rank, step)
        return self._autocast()

    def _loss(self, state: TrainState, batch: Any) -> torch.Tensor:
        """The module's ``compute_loss`` (else classification's) on the batch, moved to this rank's device."""
        assert state.wrapped is not None
        compute = getattr(self.module, "compute_loss", default_loss)
        return compute(state.wrapped, to_device(batch, self.ctx.device), self.ctx)

    def _report(self, state: TrainState, loss: torch.Tensor, epoch: int, progress: Progress) -> None:
        """Every ``--log-every`` steps the chief logs the progress line and the loss (also to TensorBoard)."""
        if self.ctx.is_chief and state.step % self.options.log_every == 0:
            value = float(loss.detach())
            fewer = f" ({self.comm.world_size // self.layout.replica_size} of " \
                f"{self.ctx.world_size // self.layout.replica_size} replicas)" if self._fewer() else ""
            log.info(progress.line(epoch + 1, self.epochs, state.step, value) + fewer)
            self._scalars("train", {"loss": value}, state.step)

    def _checkpoint_due(self, state: TrainState, batches: TrainBatches) -> bool:
        """A ``--checkpoint-every`` step inside the epoch (its end checkpoints anyway)."""
        every = self.options.checkpoint_every
        return bool(every) and state.step % every == 0 and batches.steps_left(state.sample) > 0

    def _snapshot(self, state: TrainState, batches: TrainBatches) -> None:
        """``--snapshot-every``: FSDP's snapshot in peer memory at a step no commit takes one at (every rank here)."""
        every, survivors = self.options.framework_option("snapshot_every"), self.guard.survivors
        if survivors is None or not every or state.step % int(every) or batches.steps_left(state.sample) == 0:
            return  # the epoch's last step: its end commits (and snapshots) anyway
        if not self._checkpoint_due(state, batches):
            survivors.snapshot(state)

    def _end_epoch(self, state: TrainState, eval_set: Dataset[Any], epoch: int, layout: Layout,
                   steps: StepGuard) -> None:
        ctx = self.ctx
        with steps.evaluating(state) as rounds:  # a stop in it commits the epoch's training, the restart evaluates
            state.metrics = evaluate(state.model, eval_set, self._eval_step(), ctx, self.comm, self.batch_size,
                                     self._workers(), self._autocast, layout.evaluates_in_lockstep, rounds)
        if state.scheduler is not None:  # after the evaluation, whose stop commits the epoch's trained state
            state.scheduler.step()
        for key, value in state.metrics.items():
            state.history.setdefault(key, []).append(value)
        state.epoch, state.batch, state.sample = epoch + 1, 0, 0
        if ctx.is_chief:
            log.info("epoch %d/%d eval %s", epoch + 1, self.epochs,
                     " ".join(f"{k}={v:.4f}" for k, v in sorted(state.metrics.items())))
            self._scalars("eval", state.metrics, state.step)
            if self.metric_name in state.metrics:
                self.reporter.report(str(self.metric_name), state.metrics[str(self.metric_name)], state.step)
        steps.epoch_done(state)

    def _finish(self, state: TrainState, layout: Layout, start_step: int, start_epoch: int, total: int,
                seconds: float) -> None:
        """Every write committed (``StepGuard.finishing``): the export as the layout exports, the summary."""
        digests = self.comm.gather_object(layout.model.digest(state.model))
        ranks = self.comm.gather_object(self.ctx.rank)
        steps = self.comm.gather_object(state.step - start_step)
        if self.writer is not None:
            with storage.store_errors(self.ctx.tensorboard_dir):
                self.writer.close()
        exported = layout.export.model(state.model, self.ctx.is_chief)  # None where this rank takes no part
        if exported is not None:
            self._export(exported, layout)
        survivors = self.guard.survivors  # HSDP: the training may end while a lost node is out
        if survivors is not None and (fewer := survivors.ended(state)) is not None:
            self.guard.record.event("fewer_replicas", step=state.step, steps=fewer, rejoined=False)
        if self.ctx.is_chief:
            if self.metric_name and start_epoch >= self.epochs:  # a rerun at the final checkpoint: report it again
                self.reporter.report_final(str(self.metric_name), state.history, state.step)
            self._summarize(state, layout, start_step, start_epoch, total, seconds, digests, ranks, steps)
        # The replicas leave together, after the export: a chief lost while exporting finds its peers still
        # there when it is restarted, so its restart (from the final checkpoint) exports again.
        self.comm.gather_object(None)

    # ---- pieces ------------------------------------------------------------------------------
    def _export(self, model: nn.Module, layout: Layout) -> None:
        """The module's ``export`` hook; else a transformers model as ``from_pretrained`` opens it
        (``hub_export.py``); else ``model.safetensors`` (``export.py``), as the layout exports."""
        hook = getattr(self.module, "export", None)
        self.hub = not callable(hook) and hub_export.is_pretrained(model)
        if not self.hub:
            export_model(model, self.ctx.model_dir, hook, self.ctx, layout.export)
            return
        limit = int(module_default(self.module, "max_shard_size", hub_export.MAX_SHARD_SIZE))
        hub_export.export_pretrained(model, self.ctx.model_dir, self.ctx.is_chief, limit)

    def _init_from(self, state: TrainState) -> None:
        """The first weights from ``--init-from`` (a Hugging Face safetensors checkpoint), this rank's part only."""
        source = str(self.options.init_from)
        self.guard.doing(f"loading the first weights from {source} (--init-from)")
        started = time.time()
        read = pretrained.load(state.model, source)
        total = self.comm.all_reduce_sum(torch.tensor([float(read)], device=self.ctx.device)).item()
        if self.ctx.is_chief:
            log.info("first weights from %s (--init-from): %.1f MiB read, this rank %.1f MiB, in %.1f s", source,
                     total / 2**20, read / 2**20, time.time() - started)

    def _eval_step(self) -> Callable[..., Any]:
        """The module's ``eval_step``; else one that follows its ``compute_loss``; else classification's."""
        own = getattr(self.module, "eval_step", None)
        if callable(own):
            return own
        loss = getattr(self.module, "compute_loss", None)
        return eval_step_from_loss(loss) if callable(loss) else default_eval_step

    def _optimizer(self, model: nn.Module) -> tuple[Any, Any]:
        hook = getattr(self.module, "build_optimizer", None)
        result = hook(model, self.args, self.ctx) if callable(hook) else torch.optim.Adam(model.parameters(), 1e-3)
        return result if isinstance(result, tuple) else (result, None)

    def _workers(self) -> int:
        cuda = self.ctx.device.type == "cuda"
        return self.options.data_workers if self.options.data_workers is not None else self.plan.loader_workers(cuda)

    def _autocast(self) -> Any:
        if self.options.bf16 and self.ctx.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    def _announce(self, steps_per_epoch: int) -> None:
        ctx = self.ctx
        if not ctx.is_chief:
            return
        from torch.utils.tensorboard import SummaryWriter

        with storage.store_errors(ctx.tensorboard_dir):  # TensorBoard writes gs:// through gcsfs itself
            self.writer = SummaryWriter(str(ctx.tensorboard_dir))
        log.info("training %d epochs x %d steps, global batch %d (%d x %d replicas, %s, %s checkpoints)",
                 self.epochs, steps_per_epoch, self.batch_size * ctx.world_size, self.batch_size, ctx.world_size,
                 self.comm.name, self.options.checkpoint_mode)

    def _scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        if self.writer is not None:
            with storage.store_errors(self.ctx.tensorboard_dir):  # its flush raises the store's errors here
                for key, value in values.items():
                    self.writer.add_scalar(f"{prefix}/{key}", value, step)

    def _summarize(self, state: TrainState, layout: Layout, start_step: int, start_epoch: int, total: int,
                   seconds: float, digests: list[Any], ranks: list[Any], steps: list[Any]) -> None:
        ctx, choice, written = self.ctx, layout.choice, layout.checkpoints.io
        global_batch = self.batch_size * ctx.world_size
        write_summary(ctx.model_dir, TrainingSummary(
            framework=self.plan.framework, strategy=choice.name, backend=self.comm.name,
            device=str(ctx.device), world_size=ctx.world_size, replicas_in_sync=ctx.world_size,
            global_batch_size=global_batch, epochs=self.epochs, start_epoch=start_epoch, start_step=start_step,
            final_step=state.step, expected_steps=total, steps_per_replica=steps, metrics=state.metrics,
            history=state.history, seconds=round(seconds, 2),
            samples_per_second=round((state.step - start_step) * global_batch / max(seconds, 1e-9), 1),
            checkpoint_blocked_seconds=round(written.blocked_seconds, 3),
            checkpoint_write_seconds=round(written.write_seconds, 3), trial=ctx.trial,
            hypertune_file=self.reporter.path, ranks=ranks, param_digests=digests, recoveries=state.recoveries,
            goodput=self.guard.goodput_so_far(), image=self.plan.image.to_dict(),
            load_with=LOAD_HUB if self.hub else layout.load_with,
            details={"init_param_digests": self.digests["init"], "start_param_digests": self.digests["start"],
                     "strategy_reason": choice.reason,
                     "compile_seconds": round(parallel.compile_seconds(), 2),
                     **({"skipped_nonfinite_steps": state.skipped} if state.skipped else {})},
        ))
        tuning = self.reporter.described(self.metric_name)
        log.info("model exported to %s; checkpoints in %s; TensorBoard logs in %s; tuning metric %s",
                 ctx.model_dir, ctx.checkpoint_dir, ctx.tensorboard_dir, tuning)
