"""The hooks-mode training loop the entrypoint owns: DDP, sampling, logging, checkpoints, export, tuning."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from entrypoint import checkpoints
from entrypoint.environments import read_settings
from entrypoint.errors import ConfigError
from entrypoint.hypertune import MetricReporter
from entrypoint.options import RunOptions
from entrypoint.outputs import local_path, resolve_outputs
from entrypoint.progress import Progress
from entrypoint.pytorch import state as tstate
from entrypoint.pytorch.collectives import Collectives
from entrypoint.topology import ClusterTopology
from entrypoint.usercode import load_hooks, module_default, parse_user_args

log = logging.getLogger("entrypoint.pytorch")


@dataclass
class Context:
    """What hooks receive as ``ctx``: ranks, device, output directories, and the chief flag."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    is_chief: bool
    model_dir: Path
    checkpoint_dir: Path
    tensorboard_dir: Path
    trial: str | None


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def default_loss(model: nn.Module, batch: Any, ctx: Context) -> torch.Tensor:
    """Classification: ``batch = (inputs, labels)``, cross-entropy on the logits."""
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)


def default_eval_step(model: nn.Module, batch: Any, ctx: Context) -> dict[str, torch.Tensor]:
    """Sums for classification metrics; the loop all-reduces them and divides by ``count``."""
    inputs, labels = batch
    logits = model(inputs)
    return {
        "loss": F.cross_entropy(logits, labels, reduction="sum"),
        "accuracy": (logits.argmax(dim=-1) == labels).sum().float(),
        "count": torch.tensor(float(labels.shape[0]), device=labels.device),
    }


def param_digest(model: nn.Module) -> str:
    """A digest of every parameter's bytes: equal on every rank when replicas are in sync."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


class Trainer:
    """Runs the user's hooks under DDP with chief-only outputs."""

    def __init__(self, options: RunOptions, module_name: str, topo: ClusterTopology, comm: Collectives) -> None:
        self.options = options
        self.module = load_hooks(module_name)
        self.args = parse_user_args(self.module, options.user_args)
        self.topo = topo
        self.comm = comm
        rank, world = comm.rank, comm.world_size
        local_rank = topo.process.local_rank if topo.process else 0
        device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
        settings = read_settings()
        outputs = resolve_outputs(job_dir=options.job_dir or settings.job_dir, model_dir=settings.model_dir,
                                  checkpoint_dir=settings.checkpoint_dir, tensorboard_dir=settings.tensorboard_dir,
                                  trial=topo.trial)
        self.ctx = Context(
            rank=rank, world_size=world, local_rank=local_rank, device=device, is_chief=rank == 0,
            model_dir=Path(local_path(outputs.model_dir)), checkpoint_dir=Path(local_path(outputs.checkpoint_dir)),
            tensorboard_dir=Path(local_path(outputs.tensorboard_dir)), trial=topo.trial,
        )
        self.epochs = int(options.epochs or module_default(self.module, "epochs", 1))
        self.batch_size = int(options.batch_size or module_default(self.module, "batch_size", 32))
        self.metric_name = options.hypertune_metric or getattr(self.module, "HYPERTUNE_METRIC", None)
        self.reporter = MetricReporter(self.ctx.is_chief, topo.trial)
        self.writer: Any = None
        self.start_digests: tuple[list[Any], list[Any]] = ([], [])

    # ---- checkpoints -------------------------------------------------------------------------
    def _resume_path(self) -> Path | None:
        """The chief picks the checkpoint (so every rank agrees) and broadcasts it, or the error."""
        choice: tuple[str | None, str | None] = (None, None)
        if self.ctx.is_chief:
            try:
                path = checkpoints.resolve_resume(self.ctx.checkpoint_dir, self.options.resume_from)
                choice = (str(path) if path else None, None)
            except ConfigError as exc:
                choice = (None, str(exc.problem))
        path_text, error = self.comm.broadcast_object(choice)
        if error is not None:
            raise ConfigError("--resume-from", error)
        return Path(path_text) if path_text else None

    def _save(self, model: nn.Module, optimizer: Any, scheduler: Any, step: int, epoch: int, batch: int) -> None:
        rngs = self.comm.gather_object(tstate.rng_state())  # every rank takes part; only the chief writes
        if not self.ctx.is_chief:
            return
        path = checkpoints.checkpoint_path(self.ctx.checkpoint_dir, step)
        payload = {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "step": step, "epoch": epoch, "batch": batch, "rng": rngs, "world_size": self.ctx.world_size,
        }
        tstate.save(path, payload, {"step": step, "epoch": epoch, "batch": batch})
        checkpoints.prune(self.ctx.checkpoint_dir, self.options.keep_checkpoints)
        log.info("checkpoint committed: %s", path)

    # ---- pieces ------------------------------------------------------------------------------
    def _optimizer(self, model: nn.Module) -> tuple[Any, Any]:
        hook = getattr(self.module, "build_optimizer", None)
        result = hook(model, self.args, self.ctx) if callable(hook) else torch.optim.Adam(model.parameters(), 1e-3)
        return result if isinstance(result, tuple) else (result, None)

    def _loader(self, dataset: Dataset[Any], sampler: DistributedSampler[Any] | None) -> DataLoader[Any]:
        """Training batches drop the ragged end (equal steps on every rank); evaluation keeps it."""
        cuda = self.ctx.device.type == "cuda"
        workers = self.options.data_workers if self.options.data_workers is not None else (2 if cuda else 0)
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, num_workers=workers,
                          pin_memory=cuda, drop_last=sampler is not None, persistent_workers=workers > 0)

    def _autocast(self) -> Any:
        if self.options.bf16 and self.ctx.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    def evaluate(self, model: nn.Module, dataset: Dataset[Any]) -> dict[str, float]:
        """Metrics over this rank's shard (no padding), summed across ranks."""
        shard = Subset(dataset, range(self.ctx.rank, len(dataset), self.ctx.world_size))  # type: ignore[arg-type]
        step_fn = getattr(self.module, "eval_step", default_eval_step)
        sums: dict[str, torch.Tensor] = {}
        model.eval()
        with torch.no_grad(), self._autocast():
            for batch in self._loader(shard, None):
                for key, value in step_fn(model, _to_device(batch, self.ctx.device), self.ctx).items():
                    sums[key] = sums.get(key, torch.zeros((), device=self.ctx.device)) + value.detach().float()
        model.train()
        keys = sorted(sums)
        vector = torch.stack([sums[k] for k in keys]) if keys else torch.zeros(0, device=self.ctx.device)
        vector = self.comm.all_reduce_sum(vector)
        totals = dict(zip(keys, vector.tolist(), strict=True))
        count = totals.pop("count", 1.0) or 1.0
        return {k: v / count for k, v in totals.items()}

    def _scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(f"{prefix}/{key}", value, step)

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self) -> None:
        """Train for the configured epochs, resuming from the newest committed checkpoint."""
        ctx, opts = self.ctx, self.options
        torch.manual_seed(opts.seed)
        train_set, eval_set = self.module.build_datasets(self.args, ctx)
        model = self.module.build_model(self.args, ctx).to(ctx.device)
        optimizer, scheduler = self._optimizer(model)
        step, start_epoch, skip = 0, 0, 0
        resume = self._resume_path()
        if resume is not None:
            saved = tstate.load(resume, ctx.device)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            if scheduler is not None and saved.get("scheduler") is not None:
                scheduler.load_state_dict(saved["scheduler"])
            step, start_epoch, skip = saved["step"], saved["epoch"], saved["batch"]
            if saved.get("world_size") == ctx.world_size:
                tstate.set_rng_state(saved["rng"][ctx.rank])
            log.info("resumed from %s at step %d (epoch %d, batch %d)", resume, step, start_epoch, skip)
        start_step = step
        init_digests = self.comm.gather_object(param_digest(model))
        ddp, optimizer = self.comm.prepare(model, optimizer, ctx.device, opts.bucket_cap_mb)
        self.start_digests = (init_digests, self.comm.gather_object(param_digest(model)))
        sampler: DistributedSampler[Any] = DistributedSampler(
            train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=opts.seed, drop_last=True)
        loader = self._loader(train_set, sampler)
        steps_per_epoch = len(loader)
        if steps_per_epoch == 0:
            raise ConfigError("--batch-size", f"{self.batch_size} x {ctx.world_size} replicas exceeds the training set")
        total = self.epochs * steps_per_epoch
        loss_fn = getattr(self.module, "compute_loss", default_loss)
        if ctx.is_chief:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(ctx.tensorboard_dir))
            log.info("training %d epochs x %d steps, global batch %d (%d x %d replicas, %s)", self.epochs,
                     steps_per_epoch, self.batch_size * ctx.world_size, self.batch_size, ctx.world_size, self.comm.name)
        progress = Progress(total, self.batch_size * ctx.world_size, start_step=step)
        metrics: dict[str, float] = {}
        started = time.time()
        for epoch in range(start_epoch, self.epochs):
            sampler.set_epoch(epoch)
            for i, batch in enumerate(loader):
                if epoch == start_epoch and i < skip:
                    continue
                with self._autocast():
                    loss = loss_fn(ddp, _to_device(batch, ctx.device), ctx)
                optimizer.zero_grad()  # set_to_none is the default (and Horovod's optimizer takes no argument)
                loss.backward()
                if opts.clip_grad_norm:
                    torch.nn.utils.clip_grad_norm_(ddp.parameters(), opts.clip_grad_norm)
                optimizer.step()
                step += 1
                if ctx.is_chief and step % opts.log_every == 0:
                    value = float(loss.detach())
                    log.info(progress.line(epoch + 1, self.epochs, step, value))
                    self._scalars("train", {"loss": value}, step)
                if opts.checkpoint_every and step % opts.checkpoint_every == 0 and i + 1 < steps_per_epoch:
                    self._save(model, optimizer, scheduler, step, epoch, i + 1)
            if scheduler is not None:
                scheduler.step()
            metrics = self.evaluate(model, eval_set)
            if ctx.is_chief:
                log.info("epoch %d/%d eval %s", epoch + 1, self.epochs,
                         " ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items())))
                self._scalars("eval", metrics, step)
                if self.metric_name in metrics:
                    self.reporter.report(str(self.metric_name), metrics[str(self.metric_name)], step)
            self._save(model, optimizer, scheduler, step, epoch + 1, 0)
        self._finish(model, metrics, start_step, step, total, time.time() - started)

    def _finish(self, model: nn.Module, metrics: dict[str, float], start: int, step: int, total: int,
                seconds: float) -> None:
        digests = self.comm.gather_object(param_digest(model))
        ranks = self.comm.gather_object(self.ctx.rank)
        if not self.ctx.is_chief:
            return
        if self.writer is not None:
            self.writer.close()
        export = getattr(self.module, "export", None)
        ctx = self.ctx
        ctx.model_dir.mkdir(parents=True, exist_ok=True)
        model_cpu = model.to("cpu").eval()
        if callable(export):
            export(model_cpu, ctx.model_dir, ctx)
        else:
            torch.save(model_cpu.state_dict(), ctx.model_dir / "state_dict.pt")
            torch.save(model_cpu, ctx.model_dir / "model.pt")
        summary = {
            "start_step": start, "final_step": step, "expected_steps": total, "epochs": self.epochs,
            "world_size": ctx.world_size, "ranks": ranks, "backend": self.comm.name, "device": str(ctx.device),
            "param_digests": digests, "metrics": metrics, "init_param_digests": self.start_digests[0],
            "start_param_digests": self.start_digests[1],
            "trial": ctx.trial, "seconds": round(seconds, 2),
            "samples_per_second": round((step - start) * self.batch_size * ctx.world_size / max(seconds, 1e-9), 1),
            "load_with": "torch.load('model.pt', weights_only=False)  # or state_dict.pt into build_model()",
            "hypertune_file": self.reporter.path,
        }
        (ctx.model_dir / "training_summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
        tuning = f"'{self.metric_name}' in {self.reporter.path}" if self.reporter.path else "not reported"
        log.info("model exported to %s; checkpoints in %s; TensorBoard logs in %s; tuning metric %s",
                 ctx.model_dir, ctx.checkpoint_dir, ctx.tensorboard_dir, tuning)
        if not math.isfinite(metrics.get("loss", 0.0)):
            log.warning("final evaluation loss is not finite")
