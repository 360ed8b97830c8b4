"""The hooks-mode training loop the entrypoint owns: DDP, sampling, logging, checkpoints, export, tuning.

Shared by PyTorch (torch.distributed) and Horovod through ``Collectives``. At every step boundary the
ranks vote on stopping (a SIGTERM on any node stops every node at the same step, after the chief
commits a checkpoint of that step); checkpoints go through the checkpoint I/O seam (asynchronous by
default); resume takes the newest committed checkpoint that loads and continues the same data order
and random streams; a hang watchdog fails a stalled job.
"""

from __future__ import annotations

import logging
import signal
import socket
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, DistributedSampler, Subset

from entrypoint import checkpoints, errors, failures, peers, recovery
from entrypoint.errors import ConfigError, NonFiniteLoss, PeerError, StopRequested
from entrypoint.hypertune import MetricReporter
from entrypoint.options import DEFAULT_BATCH_SIZE, DEFAULT_EPOCHS
from entrypoint.outputs import ensure_writable, local_path
from entrypoint.plan import Plan
from entrypoint.progress import Progress
from entrypoint.pytorch import state as rng
from entrypoint.pytorch.checkpoint_io import LOAD_WITH, export_model, make_io
from entrypoint.pytorch.collectives import Collectives
from entrypoint.pytorch.data import EpochSampler, make_loader, seed_loader, to_device
from entrypoint.pytorch.defaults import Context, default_eval_step, default_loss, param_digest
from entrypoint.pytorch.vote import StepVote, Verdict, nonfinite
from entrypoint.signals import StopRequest
from entrypoint.summary import TrainingSummary, write_summary
from entrypoint.usercode import load_hooks, module_default, parse_user_args
from entrypoint.watchdog import HangWatchdog

log = logging.getLogger("entrypoint.pytorch")


@dataclass
class _State:
    """The training state the loop carries: the model (and its DDP wrapper), optimizer, position, metrics."""

    model: nn.Module
    optimizer: Any
    scheduler: Any
    ddp: nn.Module | None = None
    step: int = 0
    epoch: int = 0
    batch: int = 0  # position inside ``epoch`` (batches done)
    saved_step: int = -1
    skipped: list[int] = field(default_factory=list)  # steps whose update was skipped (non-finite loss)
    recoveries: list[dict[str, Any]] = field(default_factory=list)  # what each resume after a failure cost
    metrics: dict[str, float] = field(default_factory=dict)
    history: dict[str, list[float]] = field(default_factory=dict)


class Trainer:
    """Runs the user's hooks under data parallelism with chief-only outputs."""

    def __init__(self, plan: Plan, comm: Collectives) -> None:
        options, code, topo = plan.options, plan.require_code(), plan.topology
        self.plan, self.options, self.comm = plan, options, comm
        self.module = load_hooks(code.target)
        self.args = parse_user_args(self.module, options.user_args)
        device = torch.device("cuda", topo.local_rank) if torch.cuda.is_available() else torch.device("cpu")
        out = plan.outputs
        self.ctx = Context(rank=comm.rank, world_size=comm.world_size, local_rank=topo.local_rank, device=device,
                           is_chief=comm.rank == 0, model_dir=Path(local_path(out.model_dir)),
                           checkpoint_dir=Path(local_path(out.checkpoint_dir)),
                           tensorboard_dir=Path(local_path(out.tensorboard_dir)), trial=topo.trial)
        self.epochs = int(options.epochs or module_default(self.module, "epochs", DEFAULT_EPOCHS))
        self.batch_size = int(options.batch_size or module_default(self.module, "batch_size", DEFAULT_BATCH_SIZE))
        self.metric_name = options.hypertune_metric or getattr(self.module, "HYPERTUNE_METRIC", None)
        self.reporter = MetricReporter(self.ctx.is_chief, topo.trial)
        self.io = make_io(options.checkpoint_mode, options.keep_checkpoints)
        self.request = StopRequest()
        self.vote = StepVote(comm, self.request, device)
        self.watchdog = HangWatchdog(options.hang_timeout, failures.active())
        self.board: peers.PeerBoard | None = None
        self.writer: Any = None
        self.digests: dict[str, list[Any]] = {}

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self) -> None:
        """Train for the configured epochs, resuming from the newest committed checkpoint that loads."""
        self.request.install()
        try:
            self._fit()
        except BaseException as exc:
            named = self._name_the_lost(exc)
            if named is not exc:
                raise named from None
            raise
        finally:
            self.request.uninstall()
            self.watchdog.stop()
            if self.board is not None:
                self.board.stop()

    def _join_board(self) -> None:
        """Every rank says who it is and starts its heartbeat (survivors use them to name a lost peer)."""
        names = self.comm.gather_object((self.plan.topology.replica_name, socket.gethostname()))
        store = self.comm.heartbeat_store()
        if store is None:
            return
        members = [peers.Member(rank, replica, host) for rank, (replica, host) in enumerate(names)]
        self.board = peers.PeerBoard(store, members[self.ctx.rank], members).start()
        self.watchdog.board = self.board

    def _name_the_lost(self, exc: BaseException) -> BaseException:
        """A lost peer, named by the heartbeats (gloo only says an address and a port); ``exc`` otherwise."""
        if self.board is None or failures.classify(exc).cls.name != "peer_lost":
            return exc
        silent = self.board.silent()
        if not silent:
            return exc
        step = self.board.step
        for lost in silent:
            failures.record_verdict(failures.active(), lost.member.replica, lost.member.rank, errors.PEER_LOST,
                                    f"{peers.describe([lost])}; the others stopped at step {step}")
        return PeerError(f"lost {peers.describe(silent)} at step {step} ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:200]})")

    def _fit(self) -> None:
        ctx, opts = self.ctx, self.options
        if ctx.is_chief:
            ensure_writable([ctx.model_dir, ctx.checkpoint_dir, ctx.tensorboard_dir])
        torch.manual_seed(opts.seed)
        self._join_board()
        train_set, eval_set = self.module.build_datasets(self.args, ctx)
        model = self.module.build_model(self.args, ctx).to(ctx.device)
        state = _State(model, *self._optimizer(model))
        self._resume(state)
        start_step, start_epoch = state.step, state.epoch
        self.digests["init"] = self.comm.gather_object(param_digest(model))
        state.ddp, state.optimizer = self.comm.prepare(model, state.optimizer, ctx.device, opts.bucket_cap_mb)
        self.digests["start"] = self.comm.gather_object(param_digest(model))
        sampler = EpochSampler(DistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank,
                                                  shuffle=True, seed=opts.seed, drop_last=True))
        loader = make_loader(train_set, self.batch_size, sampler, self._workers(), ctx.device.type == "cuda", True)
        steps_per_epoch = len(sampler.inner) // self.batch_size
        if steps_per_epoch == 0:
            raise ConfigError("--batch-size", f"{self.batch_size} x {ctx.world_size} replicas exceeds the training set")
        self._announce(steps_per_epoch)
        progress = Progress(self.epochs * steps_per_epoch, self.batch_size * ctx.world_size, start_step=state.step)
        started = time.time()
        self.watchdog.start()
        for epoch in range(state.epoch, self.epochs):
            sampler.start(epoch, state.batch * self.batch_size)
            seed_loader(loader, opts.seed, epoch)
            self._train_epoch(state, loader, epoch, steps_per_epoch, progress)
            self._end_epoch(state, eval_set, epoch)
        self._finish(state, start_step, start_epoch, self.epochs * steps_per_epoch, time.time() - started)

    def _train_epoch(self, state: _State, loader: Any, epoch: int, steps_per_epoch: int, progress: Progress) -> None:
        ctx, opts, ddp = self.ctx, self.options, state.ddp
        assert ddp is not None
        loss_fn = getattr(self.module, "compute_loss", default_loss)
        for i, batch in enumerate(loader, start=state.batch):
            self.watchdog.phase = "in a training step"
            with self._autocast():
                loss = loss_fn(ddp, to_device(batch, ctx.device), ctx)
            state.optimizer.zero_grad()  # set_to_none is the default (Horovod's optimizer takes no argument)
            loss.backward()
            applied = self._apply(state, loss, ddp)
            state.step, state.batch = state.step + 1, i + 1
            self.watchdog.beat(state.step, "waiting for the next batch")
            self.io.check()
            if ctx.is_chief and state.step % opts.log_every == 0:
                value = float(loss.detach())
                log.info(progress.line(epoch + 1, self.epochs, state.step, value))
                self._scalars("train", {"loss": value}, state.step)
            verdict = self.vote.poll(state.step, loss if applied is None else None)
            if verdict is not None and verdict.nonfinite:
                self._nonfinite(state, verdict)
            if verdict is not None and verdict.stop:
                self._stop(state)
            if opts.checkpoint_every and state.step % opts.checkpoint_every == 0 and i + 1 < steps_per_epoch:
                self._save(state)

    def _apply(self, state: _State, loss: torch.Tensor, ddp: nn.Module) -> bool | None:
        """The optimizer step; with ``--on-nonfinite skip`` every rank first agrees the loss is finite.

        Returns None when the loss is checked later by the step vote (``fail``), else whether the update
        was applied (``skip``: one small synchronous all-reduce per step).
        """
        checked = self.options.on_nonfinite == "skip"
        if checked and (bad := int(self.comm.all_reduce_sum(nonfinite(loss)).item())):
            self.comm.discard_step(state.optimizer)
            state.skipped.append(state.step + 1)
            if self.ctx.is_chief:
                log.warning("step %d: the loss is NaN or infinite on %d of %d ranks: update skipped "
                            "(--on-nonfinite skip; %d skipped so far)", state.step + 1, bad, self.ctx.world_size,
                            len(state.skipped))
            return False
        if self.options.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), self.options.clip_grad_norm)
        state.optimizer.step()
        return True if checked else None

    def _settle(self, state: _State) -> bool:
        """Finish the vote in flight before saving, evaluating or exporting; True when the ranks agreed to stop."""
        verdict = self.vote.drain()
        if verdict is not None and verdict.nonfinite:
            self._nonfinite(state, verdict)
        return verdict is not None and verdict.stop

    def _nonfinite(self, state: _State, verdict: Verdict) -> None:
        """Every rank saw the same non-finite step: keep what is committed (all finite), export nothing, fail."""
        self.io.wait()
        newest = checkpoints.checkpoint_path(self.ctx.checkpoint_dir, state.saved_step)
        kept = f"the newest committed checkpoint, {newest}, is from before it" if state.saved_step >= 0 else \
            "no checkpoint was committed"
        raise NonFiniteLoss(f"the training loss was NaN or infinite at step {verdict.step} on {verdict.nonfinite} of "
                            f"{self.ctx.world_size} ranks: nothing exported, no metric reported; {kept} "
                            "(lower the learning rate, check the data, or pass --on-nonfinite skip)")

    def _end_epoch(self, state: _State, eval_set: Dataset[Any], epoch: int) -> None:
        ctx = self.ctx
        if self._settle(state):
            self._stop(state)
        if state.scheduler is not None:
            state.scheduler.step()
        self.watchdog.phase = "evaluating"
        state.metrics = self.evaluate(state.model, eval_set)
        for key, value in state.metrics.items():
            state.history.setdefault(key, []).append(value)
        state.epoch, state.batch = epoch + 1, 0
        if ctx.is_chief:
            log.info("epoch %d/%d eval %s", epoch + 1, self.epochs,
                     " ".join(f"{k}={v:.4f}" for k, v in sorted(state.metrics.items())))
            self._scalars("eval", state.metrics, state.step)
            if self.metric_name in state.metrics:
                self.reporter.report(str(self.metric_name), state.metrics[str(self.metric_name)], state.step)
        self._save(state)
        self.watchdog.beat(state.step, "waiting for the next batch")

    def _stop(self, state: _State) -> None:
        """Every rank agreed to stop: commit this exact step (chief), wait for the write, exit 128 + signal."""
        signum = self.request.signum or signal.SIGTERM
        name = signal.Signals(signum).name
        self.watchdog.phase = "saving before stopping"
        self._settle(state)  # the stop step itself must be finite before it is committed
        if state.saved_step != state.step:
            self._save(state)
        self.io.wait()
        path = checkpoints.checkpoint_path(self.ctx.checkpoint_dir, state.step)
        if self.ctx.is_chief:
            log.info("stopped by %s at step %d: checkpoint %s committed", name, state.step, path)
        raise StopRequested(signum, f"stopped by {name} at step {state.step}; the restart resumes from {path}")

    # ---- checkpoints -------------------------------------------------------------------------
    def _save(self, state: _State) -> None:
        """Every rank gives its RNG state; the chief hands the full state to the checkpoint I/O."""
        if self._settle(state):
            self._stop(state)
        self.watchdog.phase = "checkpointing"
        rngs = self.comm.gather_object(rng.rng_state())
        state.saved_step = state.step
        if not self.ctx.is_chief:
            return
        payload = {
            "model": state.model.state_dict(), "optimizer": state.optimizer.state_dict(),
            "scheduler": state.scheduler.state_dict() if state.scheduler is not None else None,
            "step": state.step, "epoch": state.epoch, "batch": state.batch, "rng": rngs,
            "world_size": self.ctx.world_size, "history": state.history, "recoveries": state.recoveries,
        }
        meta = {"step": state.step, "epoch": state.epoch, "batch": state.batch, "framework": self.plan.framework,
                "reached_at": recovery.reached_at()}
        self.io.save(checkpoints.checkpoint_path(self.ctx.checkpoint_dir, state.step), payload, meta)

    def _resume(self, state: _State) -> None:
        """The chief picks the checkpoint (the newest that verifies and loads) and tells every rank what it cost."""
        choice: tuple[str | None, tuple[str, str] | None, dict[str, Any] | None] = (None, None, None)
        if self.ctx.is_chief:
            try:
                found = checkpoints.load_newest(self.ctx.checkpoint_dir, self.options.resume_from,
                                                lambda path: self._load(path, state), self.io.retention)
                lost = None
                if found is not None:
                    reached = checkpoints.read_marker(found[0]).get("reached_at")
                    lost = recovery.after_resume(self.plan.outputs.job_dir, state.step, reached)
                choice = (str(found[0]) if found else None, None, lost.to_dict() if lost else None)
            except ConfigError as exc:
                choice = (None, (exc.source, exc.problem), None)
        path_text, error, lost_work = self.comm.broadcast_object(choice)
        if error is not None:
            raise ConfigError(*error)
        if path_text is None:
            return
        if not self.ctx.is_chief:
            self._load(Path(path_text), state)
        log.info("resumed from %s at step %d (epoch %d, batch %d)", path_text, state.step, state.epoch, state.batch)
        if lost_work is not None:
            state.recoveries.append(lost_work)
            log.info("%s", recovery.Recovery(**lost_work).line())

    def _load(self, path: Path, state: _State) -> None:
        saved = self.io.load(path, self.ctx.device)
        state.model.load_state_dict(saved["model"])
        state.optimizer.load_state_dict(saved["optimizer"])
        if state.scheduler is not None and saved.get("scheduler") is not None:
            state.scheduler.load_state_dict(saved["scheduler"])
        state.step, state.epoch, state.batch = saved["step"], saved["epoch"], saved["batch"]
        state.saved_step, state.history = state.step, dict(saved.get("history") or {})
        state.recoveries = list(saved.get("recoveries") or [])
        if saved.get("world_size") == self.ctx.world_size:
            rng.set_rng_state(saved["rng"][self.ctx.rank])

    # ---- pieces ------------------------------------------------------------------------------
    def _optimizer(self, model: nn.Module) -> tuple[Any, Any]:
        hook = getattr(self.module, "build_optimizer", None)
        result = hook(model, self.args, self.ctx) if callable(hook) else torch.optim.Adam(model.parameters(), 1e-3)
        return result if isinstance(result, tuple) else (result, None)

    def _workers(self) -> int:
        cuda = self.ctx.device.type == "cuda"
        return self.options.data_workers if self.options.data_workers is not None else (2 if cuda else 0)

    def _autocast(self) -> Any:
        if self.options.bf16 and self.ctx.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    def _announce(self, steps_per_epoch: int) -> None:
        ctx = self.ctx
        if not ctx.is_chief:
            return
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(ctx.tensorboard_dir))
        log.info("training %d epochs x %d steps, global batch %d (%d x %d replicas, %s, %s checkpoints)",
                 self.epochs, steps_per_epoch, self.batch_size * ctx.world_size, self.batch_size, ctx.world_size,
                 self.comm.name, self.options.checkpoint_mode)

    def evaluate(self, model: nn.Module, dataset: Dataset[Any]) -> dict[str, float]:
        """Metrics over this rank's shard (no padding), summed across ranks."""
        ctx = self.ctx
        shard = Subset(dataset, range(ctx.rank, len(dataset), ctx.world_size))  # type: ignore[arg-type]
        step_fn = getattr(self.module, "eval_step", default_eval_step)
        sums: dict[str, torch.Tensor] = {}
        model.eval()
        loader = make_loader(shard, self.batch_size, None, self._workers(), ctx.device.type == "cuda", False)
        with torch.no_grad(), self._autocast():
            for batch in loader:
                for key, value in step_fn(model, to_device(batch, ctx.device), ctx).items():
                    sums[key] = sums.get(key, torch.zeros((), device=ctx.device)) + value.detach().float()
        model.train()
        keys = sorted(sums)
        vector = torch.stack([sums[k] for k in keys]) if keys else torch.zeros(0, device=ctx.device)
        totals = dict(zip(keys, self.comm.all_reduce_sum(vector).tolist(), strict=True))
        count = totals.pop("count", 1.0) or 1.0
        return {k: v / count for k, v in totals.items()}

    def _scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(f"{prefix}/{key}", value, step)

    def _finish(self, state: _State, start_step: int, start_epoch: int, total: int, seconds: float) -> None:
        self._settle(state)  # a stop asked for at the very end is moot: training is complete
        self.io.wait()
        digests = self.comm.gather_object(param_digest(state.model))
        ranks = self.comm.gather_object(self.ctx.rank)
        steps = self.comm.gather_object(state.step - start_step)
        self.watchdog.phase = "exporting the model (chief) and waiting for it (the others)"
        if self.ctx.is_chief:
            self._export(state, start_step, start_epoch, total, seconds, digests, ranks, steps)
        # The replicas leave together, after the export: a chief lost while exporting finds its peers still
        # there when it is restarted, so its restart (from the final checkpoint) exports again.
        self.comm.gather_object(None)

    def _export(self, state: _State, start_step: int, start_epoch: int, total: int, seconds: float,
                digests: list[Any], ranks: list[Any], steps: list[Any]) -> None:
        ctx = self.ctx
        if self.writer is not None:
            self.writer.close()
        export_model(state.model.to("cpu").eval(), ctx.model_dir, getattr(self.module, "export", None), ctx)
        global_batch = self.batch_size * ctx.world_size
        write_summary(ctx.model_dir, TrainingSummary(
            framework=self.plan.framework, strategy=self.plan.strategy, backend=self.comm.name,
            device=str(ctx.device), world_size=ctx.world_size, replicas_in_sync=ctx.world_size,
            global_batch_size=global_batch, epochs=self.epochs, start_epoch=start_epoch, start_step=start_step,
            final_step=state.step, expected_steps=total, steps_per_replica=steps, metrics=state.metrics,
            history=state.history, seconds=round(seconds, 2),
            samples_per_second=round((state.step - start_step) * global_batch / max(seconds, 1e-9), 1),
            checkpoint_blocked_seconds=round(self.io.blocked_seconds, 3),
            checkpoint_write_seconds=round(self.io.write_seconds, 3), trial=ctx.trial,
            hypertune_file=self.reporter.path, ranks=ranks, param_digests=digests, recoveries=state.recoveries,
            load_with="torch.load('model.pt', weights_only=False)  # or state_dict.pt into build_model(); "
                      f"a checkpoint: {LOAD_WITH}",
            details={"init_param_digests": self.digests["init"], "start_param_digests": self.digests["start"],
                     **({"skipped_nonfinite_steps": state.skipped} if state.skipped else {})},
        ))
        tuning = f"'{self.metric_name}' in {self.reporter.path}" if self.reporter.path else "not reported"
        log.info("model exported to %s; checkpoints in %s; TensorBoard logs in %s; tuning metric %s",
                 ctx.model_dir, ctx.checkpoint_dir, ctx.tensorboard_dir, tuning)
