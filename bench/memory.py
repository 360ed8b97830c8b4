"""Peak memory on a node: processes that do not train (launchers, agents), sharded vs replicated training, export.

Each job is started and its process tree sampled from /proc every 50 ms; every process's peak resident
set (``VmHWM``) is kept. Training processes name themselves (the scripts touch ``$BENCH_PID_DIR/<pid>``).

- Launchers: everything in the tree that does not train counts, and the row reports the sum of those peaks
  (MiB), with each process in the note. Compared: our in-process run (nothing besides the trainer),
  ``torchrun``'s agent, our elastic agent (``--nproc-per-node 2``), the ``local`` supervisor, and the Horovod
  launchers (ours vs ``horovodrun``).
- Training (issue #29): ``entrypoint run --module bench.gpt_hooks --nproc-per-node 2 --strategy ddp|fsdp`` on
  CPU, a 110M-parameter GPT (``bench.gpt`` config ``100m``) with AdamW, a few steps of batch 1. Each rank
  records its own ``VmHWM`` when training ends (its first evaluation batch: before the epoch's checkpoint and
  the export); the row is the larger of the two ranks. Target: FSDP at most 0.6x DDP per rank. glibc's malloc
  decides much of it (its dynamic mmap threshold sends FSDP's per-block all-gather buffers to a heap that then
  fragments; a sharded job on CPU therefore sets a 128 KiB threshold itself with ``mallopt``), so both run twice:
  with no ``MALLOC_`` variable (what a user gets) and with ``MALLOC_MMAP_THRESHOLD_=131072``. These jobs
  run in the PyTorch venv whichever venv the family runs in: where TensorFlow is installed (the Horovod venv),
  the chief's ``torch.utils.tensorboard`` imports it (+0.6 GiB on rank 0 alone).
- Export: in the FSDP runs, rank 0's peak resident set rise while the entrypoint writes ``model.safetensors``
  (streamed tensor by tensor, ``entrypoint/pytorch/loop/export.py``), next to the largest tensor. Target: at most the
  largest tensor plus a fixed buffer (``EXPORT_BUFFER_MIB``).
- Pretrained weights (issue #45): ``bench.init_hooks``, a GPT of 972M parameters (3,706 MiB in fp32; a few MB at the
  quick size) saved as ``model.safetensors``, loaded under ``--strategy fsdp`` at world 2 with ``--init-from`` (built
  on the meta device, sharded, each rank reading its shards) and, side by side, by ``build_model`` (the whole model
  on every rank, then sharded). Each rank's peak resident set at its first step over its resident set before
  ``build_model`` (the loading's own memory), the larger rank's, against the model's size. Target: ``--init-from``
  at most ``INIT_TARGET`` x the model (full size only).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    FamilyResult,
    Row,
    check,
    clean_env,
    compare,
    devices_for,
    free_port,
    interleave,
    median,
    python,
    pytorch_python,
)

DDP_SCRIPT, HVD_SCRIPT = str(REPO / "bench" / "ddp_script.py"), str(REPO / "bench" / "hvd_script.py")
# No MALLOC_ variable (DDP: glibc's malloc as it comes; FSDP: the entrypoint's mallopt), and a fixed mmap threshold
# set by the user (allocations from 128 KiB up are mapped and unmapped; the entrypoint leaves it alone).
MALLOCS = {"no MALLOC_ variable": {}, "MALLOC_MMAP_THRESHOLD_=131072": {"MALLOC_MMAP_THRESHOLD_": "131072"}}
STRATEGIES = ("ddp", "fsdp")
TARGET_CONFIG = "100m"  # the targets are set for a ~100M-parameter GPT (the quick size only checks the path)
FSDP_TARGET = 0.6  # FSDP's peak per rank at most this fraction of DDP's (world 2)
EXPORT_BUFFER_MIB = 32.0  # the export's peak rise may exceed the largest tensor by at most this much
INIT_TARGET = 0.6  # --init-from's loading peak per rank at most this fraction of the model (world 2)
INIT_WAYS = {"--init-from (each rank reads its shards)": "init", "build_model loads it whole, then sharded": "build"}


@dataclass
class Tree:
    """Per-process peak RSS (MiB) and name of a process tree, sampled while it runs."""

    root: int
    peaks: dict[int, float] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)

    def sample(self) -> None:
        """One pass over /proc: find the root's descendants, keep each one's VmHWM."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry.name))
        todo = [self.root]
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            self._read(pid)

    def _read(self, pid: int) -> None:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                self.peaks[pid] = max(self.peaks.get(pid, 0.0), int(line.split()[1]) / 1024)
                self.names.setdefault(pid, short_name(cmdline))


def short_name(cmdline: str) -> str:
    """What a process is, in a few words (``python -m entrypoint local``, ``torchrun``, ...)."""
    words = [w for w in cmdline.split() if not w.startswith("/") or w.endswith(".py")]
    for marker in ("entrypoint.worker", "torch.distributed.run", "horovodrun", "entrypoint", "multiprocessing"):
        for i, w in enumerate(words):
            if marker in w:
                return " ".join(words[i:i + 2])
    return " ".join(Path(w).name for w in cmdline.split()[:3])


def peak_non_training(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Run ``cmd``; the summed peak RSS of its non-training processes (MiB) and who they were."""
    with tempfile.TemporaryDirectory() as pids, tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, env={**env, "BENCH_PID_DIR": pids}, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        tree = Tree(proc.pid)
        while proc.poll() is None:
            tree.sample()
            time.sleep(0.05)
        if proc.returncode != 0:
            log.seek(0)
            tail = log.read()[-3000:].decode(errors="replace")
            raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{tail}")
        training = {int(p.name) for p in Path(pids).iterdir()}
    others = {pid: mib for pid, mib in tree.peaks.items() if pid not in training}
    who = ", ".join(f"{tree.names[pid]} {mib:.0f}" for pid, mib in sorted(others.items()))
    return sum(others.values()), who or "none"


def peak_training(cmd: list[str], env: dict[str, str], job: Path) -> dict[str, Any]:
    """Run a ``bench.gpt_hooks`` job; each rank's training peak (what it recorded), each training process's
    whole-run peak (sampled: the checkpoint and the export included) and what its export hook measured."""
    with tempfile.TemporaryDirectory() as pids, tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, env={**env, "BENCH_PID_DIR": pids}, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        tree = Tree(proc.pid)
        while proc.poll() is None:
            tree.sample()
            time.sleep(0.05)
        if proc.returncode != 0:
            log.seek(0)
            tail = log.read()[-3000:].decode(errors="replace")
            raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{tail}")
        records = {int(p.name): json.loads(p.read_text() or "{}") for p in Path(pids).iterdir()}
    if len(records) != 2 or not all("train_peak_mib" in r for r in records.values()):
        raise RuntimeError(f"expected 2 training processes to record their peaks, got {records}")
    ranks = {r["rank"]: r["train_peak_mib"] for r in records.values()}
    whole = {r["rank"]: tree.peaks.get(pid, 0.0) for pid, r in records.items()}
    timing = json.loads((job / "model" / "bench_timing.json").read_text())
    summary = json.loads((job / "model" / "training_summary.json").read_text())
    return {"ranks": ranks, "whole": whole, "timing": timing, "strategy": summary["strategy"]}


def training_command(strategy: str, config: str, steps: int, job: Path) -> list[str]:
    """``entrypoint run`` of the GPT hooks module on 2 processes, in the PyTorch venv (the Horovod one also holds
    TensorFlow, which ``torch.utils.tensorboard`` imports on the chief: +0.6 GiB); FSDP also measures the export."""
    return [*pytorch_python(), "-m", "entrypoint", "run", "--framework", "pytorch", "--module", "bench.gpt_hooks",
            "--nproc-per-node", "2", "--strategy", strategy, "--job-dir", str(job), "--batch-size", "1",
            "--log-every", "1000000", "--", "--config", config, "--steps", str(steps), "--warmup", "0", "--batch",
            "1", *(["--export"] if strategy == "fsdp" else [])]


def training_env(malloc: dict[str, str]) -> dict[str, str]:
    """On CPU (this is host memory), with ``malloc``'s settings and no others inherited."""
    env = {k: v for k, v in clean_env({"CUDA_VISIBLE_DEVICES": ""}).items() if not k.startswith("MALLOC_")}
    return {**env, **malloc}


def training_rows(runs: dict[str, list[dict[str, Any]]], mallocs: dict[str, dict[str, str]], config: str,
                  steps: int) -> list[Row]:
    """Per malloc setting: DDP (anchor) vs FSDP, the larger rank's training peak; then the export's rise."""
    rows: list[Row] = []
    for malloc in mallocs:
        names = {s: f"entrypoint run --strategy {s}" for s in STRATEGIES}
        results = {names[s]: [max(r["ranks"].values()) for r in runs[f"{s}, {malloc}"]] for s in STRATEGIES}
        group = f"training per rank, 2 processes, {malloc}"
        block = compare(group, results, "MiB", names["ddp"], "x DDP")
        if config == TARGET_CONFIG:  # the target is set at ~100M parameters
            check(block[1], "<=", FSDP_TARGET)
        for row, strategy in zip(block, STRATEGIES, strict=True):
            last = runs[f"{strategy}, {malloc}"][-1]
            seconds = last["timing"]["seconds"] / max(last["timing"]["timed_steps"], 1)
            row.note = (f"ranks {' / '.join(f'{v:.0f}' for _, v in sorted(last['ranks'].items()))} MiB at the end of "
                        f"training; whole run (checkpoint, export) "
                        f"{' / '.join(f'{v:.0f}' for _, v in sorted(last['whole'].items()))}; {config}, {steps} "
                        f"steps of batch 1, {seconds:.1f} s a step; ran as {last['strategy']} (last run)")
        rows += block
    for malloc in mallocs:
        fsdp = runs[f"fsdp, {malloc}"]
        rises = [float(r["timing"]["export_rise_mib"]) for r in fsdp]
        largest, timing = float(fsdp[-1]["timing"]["largest_tensor_mib"]), fsdp[-1]["timing"]
        row = Row(group="export of the FSDP model, rank 0", variant=f"model.safetensors, {malloc}", unit="MiB rise",
                  runs=[round(v, 1) for v in rises], median=round(median(rises), 1),
                  ratio=round(median(rises) / largest, 3), ratio_label="x largest tensor",
                  note=f"largest tensor {largest:.1f} MiB; {timing['tensors']} tensors, "
                       f"{timing['tensors_mib']:.0f} MiB in the file; resident before "
                       f"{timing['export_rss_before_mib']:.0f} MiB; {timing['export_seconds']:.1f} s (last run)")
        if config == TARGET_CONFIG:
            row.target = f"<= largest + {EXPORT_BUFFER_MIB:g} MiB"
            row.met = median(rises) <= largest + EXPORT_BUFFER_MIB
        rows.append(row)
    return rows


def loading_peaks(config: str, checkpoint: Path, way: str) -> dict[int, dict[str, float]]:
    """One ``bench.init_hooks`` job at world 2 under FSDP loading ``checkpoint`` its ``way`` (``init``: with
    ``--init-from``; ``build``: in ``build_model``); what each rank recorded, by rank."""
    with tempfile.TemporaryDirectory() as job, tempfile.TemporaryDirectory() as pids, \
            tempfile.TemporaryFile() as log:
        load = ["--init-from", str(checkpoint)] if way == "init" else []
        cmd = [*pytorch_python(), "-m", "entrypoint", "run", "--framework", "pytorch", "--module", "bench.init_hooks",
               "--nproc-per-node", "2", "--strategy", "fsdp", "--job-dir", job, "--timeout", "600", *load, "--",
               "--config", config, *(["--load", str(checkpoint)] if way == "build" else [])]
        proc = subprocess.run(cmd, env={**training_env({}), "BENCH_PID_DIR": pids}, cwd=REPO, stdout=log,
                              stderr=subprocess.STDOUT, timeout=3600)
        if proc.returncode != 0:
            log.seek(0)
            tail = log.read()[-3000:].decode(errors="replace")
            raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{tail}")
        records = [json.loads(p.read_text()) for p in Path(pids).iterdir()]
    if len(records) != 2:
        raise RuntimeError(f"expected 2 training processes to record their peaks, got {records}")
    return {int(r["rank"]): r for r in records}


def loading_rows(quick: bool) -> list[Row]:
    """``--init-from`` against loading in ``build_model``: each job's larger rank's loading rise (MiB), and that
    against the model's size."""
    from bench.init_hooks import CONFIGS

    config = "quick" if quick else "1b"
    with tempfile.TemporaryDirectory() as where:
        checkpoint = Path(where) / "pretrained"
        saver = subprocess.run([*pytorch_python(), "-m", "bench.init_hooks", "save", "--config", config,
                                str(checkpoint)], env=training_env({}), cwd=REPO, capture_output=True, text=True,
                               timeout=3600)
        if saver.returncode != 0:
            raise RuntimeError(f"saving the {config} checkpoint failed: {saver.stderr[-2000:]}")
        model_mib = json.loads(saver.stdout.strip().splitlines()[-1])["model_bytes"] / 2**20
        found: dict[str, dict[int, dict[str, float]]] = {}

        def measure(name: str) -> float:
            found[name] = loading_peaks(config, checkpoint, INIT_WAYS[name])
            return max(r["train_peak_mib"] - r["before_mib"] for r in found[name].values())

        results = interleave({name: partial(measure, name) for name in INIT_WAYS}, 1)
    cfg = CONFIGS[config]
    group = f"loading {model_mib:,.0f} MiB of pretrained weights, FSDP, 2 processes (the larger rank)"
    rows = compare(group, results, "MiB", next(iter(INIT_WAYS)), "")
    for row in rows:
        row.ratio, row.ratio_label = round(row.median / model_mib, 3), "x the model"
        ranks = [found[row.variant][rank] for rank in sorted(found[row.variant])]
        rises = " / ".join(f"{r['train_peak_mib'] - r['before_mib']:.0f}" for r in ranks)
        peaks = " / ".join(f"{r['train_peak_mib']:.0f}" for r in ranks)
        row.note = (f"rise over the resident set before build_model, ranks {rises} MiB (peaks {peaks}); GPT "
                    f"{cfg.n_layer} x {cfg.n_embd}, vocabulary {cfg.vocab_size}, {model_mib:,.0f} MiB in fp32")
    if not quick:
        check(rows[0], "<=", INIT_TARGET)
    return rows


Command = Callable[[Path], list[str]]  # the job's command, given an output directory


def jobs(steps: int, horovod: bool, quick: bool) -> dict[str, tuple[str, dict[str, Command]]]:
    """Every launcher to measure, by group: group -> (its anchor, {name: command}); ``quick`` skips 1 process and the
    ``local`` supervisor (the launch family starts ``local`` at quick size too)."""
    ddp, after = ["--framework", "pytorch", "--script", DDP_SCRIPT], ["--", "--steps", str(steps)]
    run = [*python(), "-m", "entrypoint", "run"]
    tr = [*python(), "-m", "torch.distributed.run", "--standalone"]
    found: dict[str, tuple[str, dict[str, Command]]] = {}
    if not quick:
        found["1 process"] = ("torchrun --nproc-per-node 1", {
            "entrypoint run (1 process, in-process)": lambda d: [*run, *ddp, "--job-dir", str(d), *after],
            "torchrun --nproc-per-node 1": lambda d: [*tr, "--nproc-per-node", "1", DDP_SCRIPT, *after[1:]]})
    found["2 processes, 1 node"] = ("torchrun --nproc-per-node 2", {
        "entrypoint run --nproc-per-node 2": lambda d: [*run, *ddp, "--nproc-per-node", "2", "--job-dir", str(d),
                                                        *after],
        "torchrun --nproc-per-node 2": lambda d: [*tr, "--nproc-per-node", "2", DDP_SCRIPT, *after[1:]]})
    if not quick:
        found["2 processes, 1 node"][1]["local --workers 2 (supervisor)"] = lambda d: [
            *python(), "-m", "entrypoint", "local", "--workers", "2", "--output-dir", str(d), "--", "run", *ddp, *after]
    horovodrun = shutil.which("horovodrun", path=str(Path(python()[0]).parent))
    if horovod and horovodrun:
        hvd = ["--framework", "horovod", "--script", HVD_SCRIPT]
        found["Horovod, 2 processes"] = ("horovodrun -np 2 --gloo", {
            "entrypoint run --framework horovod --nproc-per-node 2": lambda d: [
                *run, *hvd, "--nproc-per-node", "2", "--job-dir", str(d), *after],
            "horovodrun -np 2 --gloo": lambda d: [
                *python(), horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", "--gloo-timeout-seconds", "120",
                "-p", str(free_port()), *python(), HVD_SCRIPT, *after[1:]]})
    return found


def run(quick: bool) -> FamilyResult:
    """Every launcher and training job, interleaved; ``quick``: one round of short jobs, without the 1-process group,
    the training jobs on the tiny GPT with glibc's default malloc only."""
    steps, repeats = (20, 1) if quick else (400, 2)
    config, train_steps = ("tiny", 2) if quick else ("100m", 3)
    mallocs = dict(list(MALLOCS.items())[:1]) if quick else MALLOCS
    horovod = importlib.util.find_spec("horovod") is not None
    groups = jobs(steps, horovod, quick)
    commands = {name: cmd for _, members in groups.values() for name, cmd in members.items()}
    who: dict[str, str] = {}
    training: dict[str, list[dict[str, Any]]] = {}

    def measure(name: str) -> float:
        with tempfile.TemporaryDirectory() as out:
            mib, who[name] = peak_non_training(commands[name](Path(out)), clean_env(devices_for(2)))
            return mib

    def train(strategy: str, malloc: str) -> float:
        with tempfile.TemporaryDirectory() as out:
            found = peak_training(training_command(strategy, config, train_steps, Path(out)),
                                  training_env(mallocs[malloc]), Path(out))
        training.setdefault(f"{strategy}, {malloc}", []).append(found)
        return float(max(found["ranks"].values()))

    variants: dict[str, Callable[[], float]] = {name: partial(measure, name) for name in commands}
    variants.update({f"{s}, {m}": partial(train, s, m) for m in mallocs for s in STRATEGIES})
    results = interleave(variants, repeats)
    result = FamilyResult("memory", "Peak memory per node: launchers and agents, training per rank, the export "
                                    "(MiB, lower is better)")
    for group, (anchor, members) in groups.items():
        rows = compare(group, {n: results[n] for n in members}, "MiB", anchor, "x " + anchor.split(" -")[0])
        for row in rows:
            row.note = who[row.variant]
        result.rows += rows
    result.rows += training_rows(training, mallocs, config, train_steps)
    result.rows += loading_rows(quick)
    if not horovod:
        result.notes.append("Horovod is not installed in this venv: the Horovod launchers need .venv/horovod")
    result.notes.append(f"launchers: VmHWM of every process in the job's tree that is not a training process, summed "
                        f"(MiB; each process in the note, from the last run); {steps} DDP steps; {repeats} "
                        "interleaved round(s); /proc sampled every 50 ms")
    result.notes.append(f"training: bench.gpt_hooks, config '{config}', AdamW, {train_steps} steps of batch 1 per "
                        f"rank, on CPU over gloo, with {pytorch_python()[0]}; each rank's VmHWM when training ends "
                        "(before the epoch's checkpoint and the export), the larger rank's in the table; FSDP target "
                        f"<= {FSDP_TARGET:g}x DDP in each malloc setting")
    result.notes.append("export: rank 0's VmHWM rise (reset through /proc/self/clear_refs) while the entrypoint "
                        "writes model.safetensors; on CPU every gathered tensor passes through gloo's all-gather, "
                        "which allocates a flat copy of its output beside it")
    result.notes.append("pretrained weights: bench.init_hooks, FSDP at world 2 on CPU; each rank's VmHWM at its first "
                        "step less its VmRSS before build_model, the larger rank's; x the model's fp32 size; "
                        f"--init-from target <= {INIT_TARGET:g}x (full size)")
    return result
