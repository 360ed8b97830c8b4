"""The hooks-mode training loop the entrypoint owns: DDP, sampling, logging, checkpoints, export, tuning.

Shared by PyTorch (torch.distributed) and Horovod through ``Collectives``. At every step boundary the
ranks vote on stopping (a SIGTERM on any node stops every node at the same step, after the chief
commits a checkpoint of that step); checkpoints go through the checkpoint I/O seam (asynchronous by
default); resume takes the newest committed checkpoint that loads and continues the same data order
and random streams; a hang watchdog fails a stalled job. With a ``Membership`` (PyTorch across nodes), a
lost peer does not end the survivors: they re-form the group with its replacement and go on (``inplace.py``).
"""

from __future__ import annotations

import logging
import signal
import socket
import time
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, DistributedSampler

from entrypoint import errors, failures
from entrypoint.cluster import envvars as ev
from entrypoint.cluster.placement import Placement
from entrypoint.errors import ConfigError, NonFiniteLoss, PeerError, StopRequested
from entrypoint.lifecycle import peers
from entrypoint.lifecycle.signals import StopRequest
from entrypoint.lifecycle.watchdog import HangWatchdog
from entrypoint.options import DEFAULT_BATCH_SIZE, DEFAULT_EPOCHS
from entrypoint.outputs import checkpoints, storage
from entrypoint.outputs.hypertune import MetricReporter
from entrypoint.outputs.locations import ensure_writable, local_path
from entrypoint.outputs.progress import Progress
from entrypoint.outputs.summary import TrainingSummary, write_summary
from entrypoint.planning.plan import Plan
from entrypoint.planning.usercode import load_hooks, module_default, parse_user_args
from entrypoint.pytorch.checkpoint_io import LOAD_WITH, export_model, make_io
from entrypoint.pytorch.collectives import Collectives, TorchDistributed
from entrypoint.pytorch.data import EpochSampler, make_loader, seed_loader, to_device
from entrypoint.pytorch.defaults import HookContext, default_eval_step, default_loss, param_digest
from entrypoint.pytorch.evaluation import evaluate
from entrypoint.pytorch.framework import BUCKET_CAP_MB_DEFAULT
from entrypoint.pytorch.membership import Membership
from entrypoint.pytorch.resume import LoopCheckpoints
from entrypoint.pytorch.state import TrainState, reseed
from entrypoint.pytorch.survivors import InPlace
from entrypoint.pytorch.vote import StepVerdict, StepVote, nonfinite

log = logging.getLogger("entrypoint.pytorch")


def check_placement(placed: Placement, comm: Collectives) -> None:
    """The framework's own rank and world size (``dist.get_rank()``, ``hvd.rank()``) must be the plan's."""
    if (comm.rank, comm.world_size) != (placed.rank, placed.world_size):
        variable = ev.HOROVOD_RANK if comm.name == "horovod" else ev.RANK
        raise ConfigError(variable, f"{comm.name} placed this process at rank {comm.rank} of {comm.world_size}, "
                                    f"but the job's layout places it at rank {placed.rank} of {placed.world_size}")


class Trainer:
    """Runs the user's hooks under data parallelism with chief-only outputs."""

    def __init__(self, plan: Plan, comm: Collectives, failure_context: failures.FailureContext,
                 membership: Membership | None = None) -> None:
        options, code, topo, placed = plan.options, plan.require_code(), plan.topology, plan.placed
        check_placement(placed, comm)
        self.plan, self.options, self.comm, self.failure_context = plan, options, comm, failure_context
        self.module = load_hooks(code.target)
        self.args = parse_user_args(self.module, options.user_args)
        device = torch.device("cuda", placed.local_rank) if torch.cuda.is_available() else torch.device("cpu")
        out = plan.outputs
        self.ctx = HookContext(rank=comm.rank, world_size=comm.world_size, local_rank=placed.local_rank, device=device,
                           is_chief=comm.rank == 0, model_dir=storage.path(local_path(out.model_dir)),
                           checkpoint_dir=storage.path(local_path(out.checkpoint_dir)),
                           tensorboard_dir=storage.path(local_path(out.tensorboard_dir)), trial=topo.trial)
        self.epochs = int(options.epochs or module_default(self.module, "epochs", DEFAULT_EPOCHS))
        self.batch_size = int(options.batch_size or module_default(self.module, "batch_size", DEFAULT_BATCH_SIZE))
        self.metric_name = options.hypertune_metric or getattr(self.module, "HYPERTUNE_METRIC", None)
        self.reporter = MetricReporter(self.ctx.is_chief, topo.trial)
        self.io = make_io(options.checkpoint_mode, options.keep_checkpoints)
        self.checkpoints = LoopCheckpoints(plan, comm, self.ctx, self.io)
        self.inplace: InPlace | None = None
        if membership is not None:
            assert isinstance(comm, TorchDistributed), "survivors keep training over torch.distributed only"
            self.inplace = InPlace(membership, comm, self.checkpoints, plan, (topo.replica_name, socket.gethostname()))
        self.request = StopRequest()
        self.vote = StepVote(comm, self.request, device)
        self.watchdog = HangWatchdog(options.hang_timeout, failure_context)
        self.board: peers.PeerBoard | None = None
        self.writer: Any = None
        self.digests: dict[str, list[Any]] = {}
        self._step_started = time.monotonic()

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

    def _join_board(self, names: list[Any] | None = None) -> None:
        """Every rank says who it is and starts its heartbeat (survivors use them to name a lost peer)."""
        if names is None:
            names = self.comm.gather_object((self.plan.topology.replica_name, socket.gethostname()))
        store = self.comm.heartbeat_store()
        if store is None:
            return
        members = [peers.Member(rank, replica, host) for rank, (replica, host) in enumerate(names)]
        self.board = peers.PeerBoard(store, members[self.ctx.rank], members).start()
        self.watchdog.board = self.board
        if self.inplace is not None:
            self.inplace.membership.names = lambda rank: members[rank].replica

    def _name_the_lost(self, exc: BaseException) -> BaseException:
        """A lost peer, named by the heartbeats (gloo only says an address and a port); ``exc`` otherwise."""
        if self.board is None or failures.classify(exc).cls.name != "peer_lost":
            return exc
        silent = self.board.silent()
        if not silent:
            return exc
        step = self.board.step
        for lost in silent:
            failures.record_verdict(self.failure_context, lost.member.replica, lost.member.rank, errors.PEER_LOST,
                                    f"{peers.describe([lost])}; the others stopped at step {step}")
        return PeerError(f"lost {peers.describe(silent)} at step {step} ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:200]})")

    def _fit(self) -> None:
        ctx, opts = self.ctx, self.options
        if ctx.is_chief:
            ensure_writable([ctx.model_dir, ctx.checkpoint_dir, ctx.tensorboard_dir])
        torch.manual_seed(opts.seed)
        train_set, eval_set = self.module.build_datasets(self.args, ctx)
        model = self.module.build_model(self.args, ctx).to(ctx.device)
        state = TrainState(model, *self._optimizer(model))
        joined = self.inplace.enter(state) if self.inplace is not None else None
        if joined is None:  # the group's first generation: every member starts here, from the newest checkpoint
            self._join_board()
            self.checkpoints.resume(state)
            self.digests["init"] = self.comm.gather_object(param_digest(model))
        else:  # a replacement: it does what the survivors do next, no more (collectives must pair up)
            self._join_board(joined.members)
            self.digests.update(init=[], start=[])
        start_step, start_epoch = state.step, state.epoch
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
        if self.inplace is not None and joined is None:
            self.inplace.started()
        while True:  # once, unless a lost peer is replaced in place: then again from rank 0's position
            try:
                bucket_cap_mb = opts.framework_option("bucket_cap_mb", BUCKET_CAP_MB_DEFAULT)
                state.ddp, state.optimizer = self.comm.prepare(model, state.optimizer, ctx.device, bucket_cap_mb)
                self.digests.setdefault("start", self.comm.gather_object(param_digest(model)))
                for epoch in range(state.epoch, self.epochs):
                    sampler.start(epoch, state.batch * self.batch_size)
                    seed_loader(loader, opts.seed, epoch)
                    self._train_epoch(state, loader, epoch, steps_per_epoch, progress)
                    self._end_epoch(state, eval_set, epoch)
                self._finish(state, start_step, start_epoch, self.epochs * steps_per_epoch, time.time() - started)
                return
            except BaseException as exc:
                if not self._recover(state, exc):
                    raise

    def _recover(self, state: TrainState, exc: BaseException) -> bool:
        """A lost peer, with survivors-keep-training on: re-form the group and go on (False: fail as usual)."""
        if self.inplace is None or failures.classify(exc).cls.name != "peer_lost":
            return False
        in_flight = time.monotonic() - self._step_started
        lost = [s.member.replica for s in self.board.silent()] if self.board is not None else []
        self.watchdog.phase = "re-forming the group after losing a peer"
        self.vote = StepVote(self.comm, self.request, self.ctx.device)
        self.inplace.recover(state, in_flight, lost)
        self.watchdog.beat(state.step, "waiting for the next batch")
        return True

    def _train_epoch(self, state: TrainState, loader: Any, epoch: int, steps_per_epoch: int,
                     progress: Progress) -> None:
        ctx, opts, ddp = self.ctx, self.options, state.ddp
        assert ddp is not None
        loss_fn = getattr(self.module, "compute_loss", default_loss)
        for i, batch in enumerate(loader, start=state.batch):
            self.watchdog.phase = "in a training step"
            self._step_started = time.monotonic()
            reseed(opts.seed, ctx.rank, state.step + 1)
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

    def _apply(self, state: TrainState, loss: torch.Tensor, ddp: nn.Module) -> bool | None:
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

    def _settle(self, state: TrainState) -> bool:
        """Finish the vote in flight before saving, evaluating or exporting; True when the ranks agreed to stop."""
        verdict = self.vote.drain()
        if verdict is not None and verdict.nonfinite:
            self._nonfinite(state, verdict)
        return verdict is not None and verdict.stop

    def _nonfinite(self, state: TrainState, verdict: StepVerdict) -> None:
        """Every rank saw the same non-finite step: keep what is committed (all finite), export nothing, fail."""
        self.io.wait()
        newest = checkpoints.checkpoint_path(self.ctx.checkpoint_dir, state.saved_step)
        kept = f"the newest committed checkpoint, {newest}, is from before it" if state.saved_step >= 0 else \
            "no checkpoint was committed"
        raise NonFiniteLoss(f"the training loss was NaN or infinite at step {verdict.step} on {verdict.nonfinite} of "
                            f"{self.ctx.world_size} ranks: nothing exported, no metric reported; {kept} "
                            "(lower the learning rate, check the data, or pass --on-nonfinite skip)")

    def _end_epoch(self, state: TrainState, eval_set: Dataset[Any], epoch: int) -> None:
        ctx = self.ctx
        if self._settle(state):
            self._stop(state)
        if state.scheduler is not None:
            state.scheduler.step()
        self.watchdog.phase = "evaluating"
        state.metrics = evaluate(state.model, eval_set, getattr(self.module, "eval_step", default_eval_step), ctx,
                                 self.comm, self.batch_size, self._workers(), self._autocast)
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

    def _stop(self, state: TrainState) -> None:
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
    def _save(self, state: TrainState) -> None:
        """Commit ``state`` (chief) once the vote in flight is settled (a stop agreed on saves in ``_stop``)."""
        if self._settle(state):
            self._stop(state)
        self.watchdog.phase = "checkpointing"
        self.checkpoints.save(state)

    # ---- pieces ------------------------------------------------------------------------------
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
        if isinstance(ctx.tensorboard_dir, storage.RemotePath):
            storage.tensorboard_through_fsspec()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(ctx.tensorboard_dir))
        log.info("training %d epochs x %d steps, global batch %d (%d x %d replicas, %s, %s checkpoints)",
                 self.epochs, steps_per_epoch, self.batch_size * ctx.world_size, self.batch_size, ctx.world_size,
                 self.comm.name, self.options.checkpoint_mode)

    def _scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(f"{prefix}/{key}", value, step)

    def _finish(self, state: TrainState, start_step: int, start_epoch: int, total: int, seconds: float) -> None:
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

    def _export(self, state: TrainState, start_step: int, start_epoch: int, total: int, seconds: float,
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
