"""Checkpoint stall: how long training is blocked by a save, synchronous vs asynchronous, at 10M and 100M parameters.

In this process, on a model of ``Linear`` layers with an Adam state (parameters + two moments: 12 bytes per
parameter), the same payload the hooks loop saves goes through:

- ``ReplicatedCheckpointIO.save`` inline (ours, ``--checkpoint-mode sync``): blocked = written;
- ``ReplicatedCheckpointIO.save`` in the background + ``wait()`` (ours, the default): blocked = the host copy, then
  a thread writes;
- ``torch.distributed.checkpoint.async_save`` (DCP, ``no_dist``), the alternative the issue names, and
  DCP's synchronous ``save`` for its write speed;
- ours again to ``gs://`` without a FUSE mount (issue #20): through gcsfs to a local GCS JSON API server
  (gcp-storage-emulator, its objects on this machine's disk), started here for the family; skipped with a
  note where the emulator is not installed.

Sharded training (issue #29), 2 processes, the 110M-parameter GPT of ``bench.gpt`` with AdamW
(``bench/sharded_ckpt.py`` under ``entrypoint run --nproc-per-node 2``): our ``ShardedCheckpointIO`` (FSDP,
sync and async) vs our ``ReplicatedCheckpointIO`` (DDP, the chief writes) vs DCP's ``async_save`` (FSDP), every
rank's slower figure. In the full size also through the hooks loop itself (``entrypoint run --module
bench.gpt_hooks --strategy fsdp|ddp --checkpoint-every 3``): the training summary's
``checkpoint_blocked_seconds`` / ``checkpoint_write_seconds`` (the chief's, summed over its saves); and the seconds
per step of the same GPT under FSDP over 2 nodes with its snapshots in peer memory on and off (``snapshot_cost.py``:
issue 54's at most 2% of a step).

Target (the async checkpoints of issue #12, #20 for gs://, #29 for the sharded writer): blocked / written at
most 0.10 at ~100M parameters.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench import snapshot_cost
from bench.common import REPO, FamilyResult, Row, check, clean_env, interleave, median, python, timed, wait_for_port

# (width, layers): ~10M and ~100M parameters; the quick size ~1M (the same code path, in seconds).
SIZES = ((1024, 10), (2048, 24))
QUICK_SIZES = ((512, 4),)
SHARDED_SCRIPT = str(REPO / "bench" / "sharded_ckpt.py")
TARGET_AT = 50e6  # parameters from which the 0.10 target applies (it is set at ~100M)
SAVE_EVERY = 3  # steps between the hooks loop's saves: longer than a write here, so no save waits for the last


def build(width: int, layers: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model and an Adam optimizer that has taken one step (so its two moments exist)."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    return model, optimizer


def payload(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    """What the hooks loop hands the checkpoint I/O (model, optimizer, position)."""
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": None, "step": step,
            "epoch": 0, "batch": step, "rng": [], "world_size": 1, "history": {}}


class Saver:
    """Runs one kind of save in ``root`` and records (blocked, written) seconds for each run."""

    def __init__(self, root: Path, model: nn.Module, optimizer: torch.optim.Optimizer, gs: str | None = None) -> None:
        self.root, self.model, self.optimizer, self.gs = root, model, optimizer, gs
        self.seconds: dict[str, list[tuple[float, float]]] = {}
        self.failed: dict[str, list[str]] = {}  # gs:// saves the store refused, by kind: why
        self.count = 0

    def _record(self, name: str, blocked: float, written: float) -> float:
        self.seconds.setdefault(name, []).append((blocked, written))
        return blocked

    def ours(self, mode: str, remote: bool = False) -> float:
        """Our checkpoint I/O; ``written`` is the write itself (in the background when async)."""
        from entrypoint.outputs import storage
        from entrypoint.pytorch.checkpoints.checkpoint_io import make_io

        self.count += 1
        name = f"ours {mode}" + (" gs://" if remote else "")
        io = make_io(mode, keep=1)
        base = storage.path(f"{self.gs}/{mode}") if remote else self.root / mode
        path = base / f"ckpt-{self.count:08d}"
        started = time.perf_counter()
        try:
            io.save(path, payload(self.model, self.optimizer, self.count), {"step": self.count})
            blocked = time.perf_counter() - started
            io.wait()
        except storage.StorageError as exc:  # the emulator, not the disk: counted as failed, shown in the row
            if not remote:
                raise
            self.failed.setdefault(name, []).append(" ".join(str(exc).split())[-160:])
            return self._record(name, math.nan, math.nan)
        return self._record(name, blocked, io.write_seconds)

    def dcp(self, asynchronous: bool) -> float:
        """DCP's ``async_save`` (blocked until it returns, written until its future resolves) or ``save``."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self.count += 1
        path = self.root / f"dcp-{self.count:08d}"
        started = time.perf_counter()
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optimizer": optim_state, "step": self.count}
        if not asynchronous:
            dcp.save(state, checkpoint_id=str(path), no_dist=True)
            blocked = time.perf_counter() - started
            return self._record("DCP save", blocked, blocked)
        future: Any = dcp.async_save(state, checkpoint_id=str(path), no_dist=True)
        blocked = time.perf_counter() - started
        future.result()
        return self._record("DCP async_save", blocked, time.perf_counter() - started - blocked)


def measure(width: int, layers: int, repeats: int, warmup: int) -> list[Row]:
    """Every kind of save of one model size, interleaved; one row each."""
    model, optimizer = build(width, layers)
    params = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory() as tmp, gcs_emulator(Path(tmp) / "gcs") as gs:
        saver = Saver(Path(tmp), model, optimizer, gs)
        variants: dict[str, Callable[[], float]] = {
            "ours sync": lambda: saver.ours("sync"), "ours async": lambda: saver.ours("async"),
            "DCP save": lambda: saver.dcp(False), "DCP async_save": lambda: saver.dcp(True)}
        if gs is not None:
            variants["ours sync gs://"] = lambda: saver.ours("sync", remote=True)
            variants["ours async gs://"] = lambda: saver.ours("async", remote=True)
        interleave(variants, repeats, warmup)
    group = f"{params / 1e6:.1f}M params ({params * 12 / 1e9:.2f} GB with Adam)"
    return rows_of(group, {name: saver.seconds[name][warmup:] for name in variants}, params, saver.failed)


def rows_of(group: str, seconds: dict[str, list[tuple[float, float]]], params: int,
            failed: dict[str, list[str]] | None = None) -> list[Row]:
    """One row per kind of save from its (blocked, written) seconds (NaN: a save that failed, said in the note);
    the target on the asynchronous kinds at ~100M."""
    rows = []
    for name, all_pairs in seconds.items():
        pairs = [(b, w) for b, w in all_pairs if not (math.isnan(b) or math.isnan(w))]
        blocked, written = [b for b, _ in pairs], [w for _, w in pairs]
        ratio = median([b / w for b, w in pairs if w > 0]) if pairs else None
        row = Row(group=group, variant=name, unit="s blocked", runs=[round(b, 4) for b in blocked],
                  median=round(median(blocked), 4), ratio=None if ratio is None else round(ratio, 4),
                  ratio_label="blocked/written",
                  note=f"written {median(written):.3g} s; {params * 12 / 1e9 / max(median(written), 1e-9):.2f} "
                       f"GB/s written; {params * 12 / 1e9 / max(median(blocked), 1e-9):.2f} GB/s blocked")
        if (failed or {}).get(name):
            errors = (failed or {})[name]
            row.note += f"; {len(errors)} save(s) failed (counting warm-up), the last: {errors[-1]}"
        if "async" in name and params >= TARGET_AT and ratio is not None:
            check(row, "<=", 0.10)
        rows.append(row)
    return rows


def sharded(config: str, repeats: int, warmup: int) -> tuple[list[Row], int]:
    """The 2-process kinds of save (``bench/sharded_ckpt.py`` under the entrypoint): rows, parameters."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [*python(), "-m", "entrypoint", "run", "--framework", "pytorch", "--script", SHARDED_SCRIPT,
               "--nproc-per-node", "2", "--job-dir", str(Path(tmp) / "job"), "--", "--config", config,
               "--repeats", str(repeats), "--warmup", str(warmup), "--dir", str(Path(tmp) / "checkpoints"),
               "--result", str(result)]
        timed([(cmd, clean_env({"CUDA_VISIBLE_DEVICES": ""}))], timeout=1800)
        found = json.loads(result.read_text())
    params = int(found["params"])
    seconds = {name: [(b, w) for b, w in pairs[warmup:]] for name, pairs in found["seconds"].items()}
    return rows_of(f"{params / 1e6:.1f}M-param GPT, 2 processes ({params * 12 / 1e9:.2f} GB with Adam)", seconds,
                   params), params


def hooks_loop(strategy: str, config: str, steps: int) -> tuple[float, float]:
    """A 2-process hooks-loop job saving every ``SAVE_EVERY`` steps: its summary's (blocked, written) seconds."""
    with tempfile.TemporaryDirectory() as job:
        cmd = [*python(), "-m", "entrypoint", "run", "--framework", "pytorch", "--module", "bench.gpt_hooks",
               "--nproc-per-node", "2", "--strategy", strategy, "--job-dir", job, "--batch-size", "1",
               "--checkpoint-every", str(SAVE_EVERY), "--log-every", "1000000", "--", "--config", config,
               "--steps", str(steps), "--warmup", "0", "--batch", "1"]
        timed([(cmd, clean_env({"CUDA_VISIBLE_DEVICES": ""}))], timeout=1800)
        summary = json.loads((Path(job) / "model" / "training_summary.json").read_text())
    return float(summary["checkpoint_blocked_seconds"]), float(summary["checkpoint_write_seconds"])


def loop_rows(group: str, config: str, steps: int, repeats: int, params: int) -> list[Row]:
    """Our two writers as the hooks loop runs them (FSDP: sharded, DDP: the chief's), interleaved."""
    seconds: dict[str, list[tuple[float, float]]] = {}

    def run_one(name: str, strategy: str) -> float:
        seconds.setdefault(name, []).append(hooks_loop(strategy, config, steps))
        return seconds[name][-1][0]

    interleave({"hooks loop: ours sharded async (FSDP)": lambda: run_one("hooks loop: ours sharded async (FSDP)",
                                                                          "fsdp"),
                "hooks loop: ours async (DDP)": lambda: run_one("hooks loop: ours async (DDP)", "ddp")}, repeats)
    return rows_of(group, seconds, params)


BUCKET = "bench"


@contextlib.contextmanager
def gcs_emulator(data_dir: Path) -> Iterator[str | None]:
    """A GCS JSON API server on 127.0.0.1 for the block, this process's gcsfs pointed at it; its bucket URL.

    None (and nothing started) where gcp-storage-emulator or gcsfs is not installed.
    """
    if importlib.util.find_spec("gcp_storage_emulator") is None or importlib.util.find_spec("gcsfs") is None:
        yield None
        return
    from entrypoint.cluster import envvars
    from entrypoint.outputs import storage

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port",
                             str(port), "--default-bucket", BUCKET, "--quiet"], env={**os.environ,
                            "STORAGE_BASE": str(data_dir)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    before = os.environ.get(envvars.STORAGE_EMULATOR_HOST)
    try:
        wait_for_port(port, proc, "the GCS emulator")
        os.environ[envvars.STORAGE_EMULATOR_HOST] = f"http://127.0.0.1:{port}"
        storage._filesystems.clear()
        yield f"gs://{BUCKET}/checkpoints"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        storage._filesystems.clear()
        if before is None:
            os.environ.pop(envvars.STORAGE_EMULATOR_HOST, None)
        else:
            os.environ[envvars.STORAGE_EMULATOR_HOST] = before


def run(quick: bool) -> FamilyResult:
    """Both sizes and the 2-process kinds; ``quick``: 1M in one process, the tiny GPT in two, one repetition."""
    sizes, repeats, warmup = (QUICK_SIZES, 1, 0) if quick else (SIZES, 3, 1)
    config, loop_steps, loop_repeats = ("tiny", 0, 0) if quick else ("100m", 2 * SAVE_EVERY, 2)
    result = FamilyResult("checkpoint", "Checkpoint stall: training blocked per save (s, lower is better)")
    for width, layers in sizes:
        result.rows += measure(width, layers, repeats, warmup)
    rows, params = sharded(config, repeats, warmup)
    result.rows += rows
    if loop_repeats:
        result.rows += loop_rows(rows[0].group, config, loop_steps, loop_repeats, params)
        peers, note = snapshot_cost.rows(f"{rows[0].group}: FSDP's snapshots in peer memory at each commit", config,
                                         4 * SAVE_EVERY + 1, loop_repeats)
        result.rows += peers
        result.notes.append(note)
    result.notes.append(f"{repeats} interleaved repetitions after {warmup} warm-up round(s), in a temporary "
                        "directory on this machine's disk; 'written' is the background write for the async kinds")
    result.notes.append("the gs:// rows write through gcsfs (resumable uploads) to gcp-storage-emulator on 127.0.0.1, "
                        "objects on this machine's disk (a pure-Python server: the ratio depends on the store's speed, "
                        "and a faster store, as Cloud Storage may be, makes it larger); no gs:// rows without the "
                        "emulator installed; a save the emulator refuses is left out of its row and said in its note "
                        "(it rewrites the whole upload at every chunk; at 1.2 GB on a loaded machine it has answered "
                        "'Invalid Content-Range start', probably a gcsfs retry racing a slow first request)")
    result.notes.append("ours async blocks for a host copy of every tensor into buffers kept between saves, then "
                        "writes with torch.save through a SHA-256 hashing writer and commits a marker; DCP stages to "
                        "CPU and writes .distcp")
    result.notes.append(f"2 processes: bench/sharded_ckpt.py under entrypoint run --nproc-per-node 2 on CPU (gloo), "
                        f"bench.gpt config '{config}' sharded as the entrypoint shards it (FSDP2 per block, then the "
                        "root) and replicated under DDP, AdamW after one step; blocked from the state dict's creation "
                        "until the call returns, the slower rank's; nothing trains during the write; DCP async_save "
                        "over its own gloo group with its default stager")
    if loop_repeats:
        result.notes.append(f"hooks loop: entrypoint run --module bench.gpt_hooks --nproc-per-node 2 --strategy "
                            f"fsdp|ddp --checkpoint-every {SAVE_EVERY}, {loop_steps} steps of batch 1 (2 saves: one "
                            "while training goes on, one at the end); the training summary's "
                            "checkpoint_blocked_seconds / checkpoint_write_seconds (the chief's, summed over the "
                            "saves; neither the state dict's creation nor a wait for a save still in flight is in "
                            f"them: the saves are {SAVE_EVERY} steps apart); {loop_repeats} interleaved runs")
    return result
