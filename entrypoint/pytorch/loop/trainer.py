"""The hooks-mode training loop the entrypoint owns: build, resume, for each epoch and batch a step, finish.

Shared by PyTorch (torch.distributed) and Horovod through ``Collectives``. The loop reads as training; what
keeps each step safe (stop signals in every phase, agreed at a step where they can be, non-finite losses, hangs,
heartbeats, survivors that keep training after a lost peer) is ``Resilience`` (``resilience.py``), called before a
step, after it, around a batch's wait and an evaluation, at a checkpoint and on a failure. Checkpoints go through
the seam (``checkpoint_io.py``, asynchronous by default) and a resumed run sees exactly the batches and random
streams of an uninterrupted one (``data.py``, ``state.py``).
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
from entrypoint.cluster.placement import Placement
from entrypoint.errors import ConfigError
from entrypoint.options import DEFAULT_BATCH_SIZE, DEFAULT_EPOCHS
from entrypoint.outputs import storage
from entrypoint.outputs.hypertune import MetricReporter
from entrypoint.outputs.locations import ensure_writable, local_path
from entrypoint.outputs.progress import Progress
from entrypoint.outputs.summary import TrainingSummary, write_summary
from entrypoint.planning import registry
from entrypoint.planning.plan import Plan
from entrypoint.planning.usercode import load_hooks, module_default, parse_user_args
from entrypoint.pytorch.checkpoints.checkpoint_io import LOAD_WITH
from entrypoint.pytorch.checkpoints.resume import LoopCheckpoints
from entrypoint.pytorch.defaults import HookContext, default_eval_step, default_loss, eval_step_from_loss, param_digest
from entrypoint.pytorch.framework import BUCKET_CAP_MB_DEFAULT
from entrypoint.pytorch.launch.collectives import Collectives, TorchDistributed
from entrypoint.pytorch.launch.membership import Membership
from entrypoint.pytorch.loop import compile_cache, hub_export, parallel, pretrained
from entrypoint.pytorch.loop.data import TrainBatches, to_device
from entrypoint.pytorch.loop.evaluation import check_evaluation_set, evaluate
from entrypoint.pytorch.loop.export import export_model
from entrypoint.pytorch.loop.parallel import Parallel
from entrypoint.pytorch.recovery.resilience import Resilience
from entrypoint.pytorch.recovery.survivors import InPlace
from entrypoint.pytorch.state import TrainState, reseed

log = logging.getLogger("entrypoint.pytorch")
LOAD_HUB = ("transformers' AutoModel...from_pretrained(model_dir) (config.json, safetensors with an index past "
            f"max_shard_size); a checkpoint: {LOAD_WITH}")


def check_placement(placed: Placement, comm: Collectives) -> None:
    """The framework's own rank and world size (``dist.get_rank()``, ``hvd.rank()``) must be the plan's."""
    if (comm.rank, comm.world_size) != (placed.rank, placed.world_size):
        raise ConfigError(comm.rank_variable, f"{comm.name} placed this process at rank {comm.rank} of "
                          f"{comm.world_size}, but the job's layout places it at rank {placed.rank} of "
                          f"{placed.world_size}")


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
        self.checkpoints = LoopCheckpoints(plan, comm, self.ctx)  # in the layout's format once the model is placed
        self.parallel: Parallel | None = None
        inplace = None
        if membership is not None:
            assert isinstance(comm, TorchDistributed), "survivors keep training over torch.distributed only"
            inplace = InPlace(membership, comm, self.checkpoints, plan, (topo.replica_name, socket.gethostname()))
        self.resilience = Resilience(plan, comm, self.ctx, self.checkpoints, failure_context, inplace)
        self.writer: Any = None
        self.digests: dict[str, list[Any]] = {}
        self.hub = False  # exported as a transformers model (from_pretrained)
        if self.ctx.is_chief:  # before the hang watchdog starts; TensorBoard's own file layer (fsspec) as in the
            storage.tensorboard_through_fsspec()  # PyTorch image, never TensorFlow's where it is installed (Horovod)
            from torch.utils import tensorboard  # noqa: F401

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self) -> None:
        """Train for the configured epochs, resuming from the newest committed checkpoint that loads."""
        with self.resilience.running() as guard:
            guard.form_group()
            state, batches, eval_set = self._build()
            start_step, start_epoch = self._resume(state)
            planned = self._planned_steps(state, batches)
            self.resilience.record.total = planned
            self._announce(batches.steps_per_epoch)
            progress = Progress(planned, self.batch_size * self.ctx.world_size, start_step=state.step)
            started = time.time()
            for attempt in guard.attempts(state):  # once, unless a lost peer is replaced in place
                with attempt:
                    self._wrap(state)
                    for epoch in range(state.epoch, self.epochs):
                        self._train_epoch(state, batches, epoch, progress)
                        self._end_epoch(state, eval_set, epoch)
            self._finish(state, start_step, start_epoch, planned, time.time() - started)

    def _planned_steps(self, state: TrainState, batches: TrainBatches) -> int:
        """The step this run ends at: the rest of the current epoch (at this world size), then whole epochs."""
        if state.epoch >= self.epochs:
            return state.step
        later = (self.epochs - state.epoch - 1) * batches.steps_per_epoch
        return state.step + batches.steps_left(state.sample) + later

    def _build(self) -> tuple[TrainState, TrainBatches, Dataset[Any]]:
        """The user's datasets, model (replicated or sharded: ``parallel.py``) and optimizer; this rank's batches."""
        ctx, opts, phase = self.ctx, self.options, self.resilience.doing
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
        phase("placing the model (sharding it, or moving it to its device)")
        self.parallel = layout = self._parallel(model)
        self.checkpoints.use(layout.checkpoint_format(opts.keep_checkpoints, opts.checkpoint_mode == "async",
                                                      opts.timeout))
        if not layout.survives_lost_peer:
            self.resilience.restart_on_loss()
        model = layout.shard(model, self._units())
        phase("building the optimizer")
        state = TrainState(model, *self._optimizer(model))
        batches = TrainBatches(train_set, self.batch_size, ctx.rank, ctx.world_size, opts.seed, self._workers(),
                               ctx.device.type == "cuda")
        if batches.steps_per_epoch == 0:
            raise ConfigError("--batch-size", f"{self.batch_size} x {ctx.world_size} replicas exceeds the training set")
        self.checkpoints.batch_size = self.batch_size
        return state, batches, eval_set

    def _parallel(self, model: nn.Module) -> Parallel:
        """DDP, FSDP or HSDP for this model (``parallel.choose``): the layout, which gives its checkpoint format."""
        ctx, opts, topo, placed = self.ctx, self.options, self.plan.topology, self.plan.placed
        choice = parallel.choose(self.plan.strategy, opts.strategy is not None,
                                 sum(p.numel() for p in model.parameters()),
                                 parallel.device_memory(ctx.device, placed.local_world_size), ctx.world_size,
                                 max(topo.num_nodes, 1), placed.local_world_size, registry.get(self.plan.framework))
        if ctx.is_chief:
            log.info("strategy %s: %s", choice.name, choice.reason)
        self.compiled = compile_cache.load(self.plan, ctx, model, self.module)  # --compile's caches (job dir)
        if not choice.sharded:
            bucket_cap_mb = opts.framework_option("bucket_cap_mb", BUCKET_CAP_MB_DEFAULT)
            return parallel.Replicated(choice, self.comm, ctx.device, bucket_cap_mb, self.compiled.on)
        parallel.same_weights_everywhere(model, self.comm)
        return parallel.Sharded(choice, ctx.device, max(topo.num_nodes, 1), placed.local_world_size, opts.bf16,
                                self.compiled.on)

    def _units(self) -> Callable[[nn.Module], list[nn.Module]] | None:
        """The module's ``shard_units(model, ctx)`` hook, checked; None for the default units."""
        hook = getattr(self.module, "shard_units", None)
        if not callable(hook):
            return None
        return lambda model: parallel.named_units(model, hook(model, self.ctx))

    def _resume(self, state: TrainState) -> tuple[int, int]:
        """Join the group; resume from the newest checkpoint (or, as a replacement, from rank 0's live state)."""
        joined = self.resilience.join(state)
        check_placement(self.plan.placed, self.comm)  # the group exists: its ranks must be the plan's
        if joined is None:  # the group's first generation: every member starts here, from the newest checkpoint
            self.resilience.starting("resuming from the newest checkpoint")
            with self.resilience.phase("restore"):
                resumed = self.checkpoints.resume(state)
            if not resumed and self.options.init_from:  # the job's own checkpoints win
                self._init_from(state)
            self.resilience.restored(state.step)
            self.digests["init"] = self.comm.gather_object(self._digest(state.model))
            self.resilience.started()
        else:  # a replacement: it does what the survivors do next, no more (collectives must pair up)
            self.digests.update(init=[], start=[])
        self.resilience.beat(state)
        return state.step, state.epoch

    def _wrap(self, state: TrainState) -> None:
        """Data parallelism over the (current) group: rank 0's parameters reach every rank."""
        assert self.parallel is not None
        check_placement(self.plan.placed, self.comm)  # again after an in-place recovery re-formed the group
        self.resilience.doing("wrapping the model for data parallelism")
        state.wrapped, state.optimizer = self.parallel.wrap(state.model, state.optimizer)
        self.digests.setdefault("start", self.comm.gather_object(self.parallel.digest(state.model)))

    def _train_epoch(self, state: TrainState, batches: TrainBatches, epoch: int, progress: Progress) -> None:
        """An epoch's steps. A step is ten things, as nanoGPT's: batches, guard (``Resilience``), state, precision (and
        random streams), loss, optimizer, backward, the agreed update, the progress report, the checkpoint schedule."""
        guard = self.resilience
        for batch in guard.fetching(batches.epoch(epoch, state.sample), state):  # a slow batch does not hold a stop
            guard.before_step()
            loss, applied = self._step(state, batch)
            state.advance(batches.samples_per_step)
            self._report(state, loss, epoch, progress)
            guard.after_step(state, loss if applied is None else None)
            self.compiled.after_step(state)  # the chief keeps --compile's caches in the job dir once they grew
            if self._checkpoint_due(state, batches):
                guard.checkpoint(state)

    def _step(self, state: TrainState, batch: Any) -> tuple[torch.Tensor, bool | None]:
        """One optimizer step; the loss, and whether the update was applied (None: checked by the vote later)."""
        with self._precision(state.step + 1):
            loss = self._loss(state, batch)
        state.optimizer.zero_grad()  # set_to_none is the default (Horovod's optimizer takes no argument)
        loss.backward()
        return loss, self._apply(state, loss)

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
            log.info(progress.line(epoch + 1, self.epochs, state.step, value))
            self._scalars("train", {"loss": value}, state.step)

    def _checkpoint_due(self, state: TrainState, batches: TrainBatches) -> bool:
        """A ``--checkpoint-every`` step inside the epoch (its end checkpoints anyway)."""
        every = self.options.checkpoint_every
        return bool(every) and state.step % every == 0 and batches.steps_left(state.sample) > 0

    def _apply(self, state: TrainState, loss: torch.Tensor) -> bool | None:
        """The optimizer step, unless every rank agreed to skip it (``Resilience.agree_finite``). Returns None when
        the loss is checked later by the step vote (``fail``), else whether the update was applied (``skip``)."""
        agreed = self.resilience.agree_finite(state, loss)
        if agreed is False:
            return False
        if self.options.clip_grad_norm:
            assert state.wrapped is not None
            torch.nn.utils.clip_grad_norm_(state.wrapped.parameters(), self.options.clip_grad_norm)
        state.optimizer.step()
        return agreed

    def _end_epoch(self, state: TrainState, eval_set: Dataset[Any], epoch: int) -> None:
        ctx, guard = self.ctx, self.resilience
        guard.settle(state)
        guard.doing("evaluating")
        with guard.phase("evaluation"):  # a stop in it commits the epoch's training, the restart evaluates again
            state.metrics = evaluate(state.model, eval_set, self._eval_step(), ctx, self.comm, self.batch_size,
                                     self._workers(), self._autocast, self.parallel is not None and
                                     self.parallel.evaluates_in_lockstep, guard.evaluation(state))
        if state.scheduler is not None:  # after the evaluation, whose stop commits the epoch's trained state
            state.scheduler.step()
        for key, value in state.metrics.items():
            state.history.setdefault(key, []).append(value)
        self.resilience.record.metrics = dict(state.metrics)
        state.epoch, state.batch, state.sample = epoch + 1, 0, 0
        if ctx.is_chief:
            log.info("epoch %d/%d eval %s", epoch + 1, self.epochs,
                     " ".join(f"{k}={v:.4f}" for k, v in sorted(state.metrics.items())))
            self._scalars("eval", state.metrics, state.step)
            if self.metric_name in state.metrics:
                self.reporter.report(str(self.metric_name), state.metrics[str(self.metric_name)], state.step)
        guard.checkpoint(state)
        guard.beat(state)

    def _finish(self, state: TrainState, start_step: int, start_epoch: int, total: int, seconds: float) -> None:
        self.resilience.finishing(state)
        digests = self.comm.gather_object(self._digest(state.model))
        ranks = self.comm.gather_object(self.ctx.rank)
        steps = self.comm.gather_object(state.step - start_step)
        if self.writer is not None:
            with storage.store_errors(self.ctx.tensorboard_dir):
                self.writer.close()
        hook = getattr(self.module, "export", None)
        self.checkpoints.close()  # the last write committed (``finishing`` waited), the writer's buffers released
        if self.parallel is not None and self.parallel.every_rank_exports:  # each its shards, tensor by tensor
            self._export(state.model.eval(), hook, sharded=True)
        elif self.ctx.is_chief:
            self._export(state.model.to("cpu").eval(), hook, sharded=False)
        if self.ctx.is_chief:
            if self.metric_name and start_epoch >= self.epochs:  # a rerun at the final checkpoint: report it again
                self.reporter.report_final(str(self.metric_name), state.history, state.step)
            self._summarize(state, start_step, start_epoch, total, seconds, digests, ranks, steps)
        # The replicas leave together, after the export: a chief lost while exporting finds its peers still
        # there when it is restarted, so its restart (from the final checkpoint) exports again.
        self.comm.gather_object(None)

    # ---- pieces ------------------------------------------------------------------------------
    def _export(self, model: nn.Module, hook: Callable[..., Any] | None, sharded: bool) -> None:
        """The module's ``export`` hook; else a transformers model as ``from_pretrained`` opens it
        (``hub_export.py``); else ``model.safetensors`` (``export.py``)."""
        self.hub = not callable(hook) and hub_export.is_pretrained(model)
        if not self.hub:
            export_model(model, self.ctx.model_dir, hook, self.ctx, sharded=sharded)
            return
        limit = int(module_default(self.module, "max_shard_size", hub_export.MAX_SHARD_SIZE))
        hub_export.export_pretrained(model, self.ctx.model_dir, self.ctx.is_chief, limit)

    def _init_from(self, state: TrainState) -> None:
        """The first weights from ``--init-from`` (a Hugging Face safetensors checkpoint), this rank's part only."""
        source = str(self.options.init_from)
        self.resilience.doing(f"loading the first weights from {source} (--init-from)")
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

    def _digest(self, model: nn.Module) -> str:
        """This rank's parameters' digest (equal on every rank of a replicated model; its shards' when sharded)."""
        return self.parallel.digest(model) if self.parallel is not None else param_digest(model)

    def _summarize(self, state: TrainState, start_step: int, start_epoch: int, total: int, seconds: float,
                   digests: list[Any], ranks: list[Any], steps: list[Any]) -> None:
        ctx = self.ctx
        choice = self.parallel.choice if self.parallel is not None else None
        global_batch = self.batch_size * ctx.world_size
        write_summary(ctx.model_dir, TrainingSummary(
            framework=self.plan.framework, strategy=choice.name if choice else self.plan.strategy,
            backend=self.comm.name,
            device=str(ctx.device), world_size=ctx.world_size, replicas_in_sync=ctx.world_size,
            global_batch_size=global_batch, epochs=self.epochs, start_epoch=start_epoch, start_step=start_step,
            final_step=state.step, expected_steps=total, steps_per_replica=steps, metrics=state.metrics,
            history=state.history, seconds=round(seconds, 2),
            samples_per_second=round((state.step - start_step) * global_batch / max(seconds, 1e-9), 1),
            checkpoint_blocked_seconds=round(self.checkpoints.io.blocked_seconds, 3),
            checkpoint_write_seconds=round(self.checkpoints.io.write_seconds, 3), trial=ctx.trial,
            hypertune_file=self.reporter.path, ranks=ranks, param_digests=digests, recoveries=state.recoveries,
            goodput=self.resilience.goodput_so_far(), image=self.plan.image.to_dict(),
            load_with=LOAD_HUB if self.hub else self.parallel.load_with if self.parallel else parallel.LOAD_REPLICATED,
            details={"init_param_digests": self.digests["init"], "start_param_digests": self.digests["start"],
                     "strategy_reason": choice.reason if choice else self.plan.reason,
                     "compile_seconds": round(parallel.compile_seconds(), 2),
                     **({"skipped_nonfinite_steps": state.skipped} if state.skipped else {})},
        ))
        tuning = self.reporter.described(self.metric_name)
        log.info("model exported to %s; checkpoints in %s; TensorBoard logs in %s; tuning metric %s",
                 ctx.model_dir, ctx.checkpoint_dir, ctx.tensorboard_dir, tuning)
