"""What every benchmark family shares: result rows, interleaved repetitions, medians, clean subprocesses.

A family measures its variants ``repeats`` times in rotating order (A B C, B C A, C A B, ...) after
``warmup`` discarded rounds, so machine noise hits every variant alike, and reports the median of each.
It returns a ``FamilyResult``: rows the report renders as they are (each family knows what its ratios
mean and which target applies), plus notes and the versions of what it ran with.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# Cluster variables a benchmark's child must not inherit from whoever started `make bench`.
_CLUSTER_VARS = ("CLUSTER_SPEC", "TF_CONFIG", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "TRAINER_PLAN_FILE", "TRAINER_MODULE", "AIP_MODEL_DIR",
                 "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR", "CLOUD_ML_TRIAL_ID")
_CLUSTER_PREFIXES = ("PET_", "OMPI_", "PMI_", "HOROVOD_", "TORCHELASTIC_")


@dataclass
class Row:
    """One measured variant: its median, every run, and how it compares with its group's anchor or target."""

    group: str  # what is compared inside one table block, e.g. "world 1"
    variant: str  # e.g. "entrypoint run"
    unit: str  # e.g. "s", "tokens/s", "MiB"
    runs: list[float]
    median: float
    ratio: float | None = None  # variant / anchor (or the quantity ``ratio_label`` names)
    ratio_label: str = ""  # e.g. "x bare", "blocked/written"
    target: str = ""  # e.g. "<= 1.05"
    met: bool | None = None  # None: no target for this row
    note: str = ""


@dataclass
class FamilyResult:
    """Everything one family measured, as the report renders it."""

    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    skipped: str = ""  # why the family did not run at all

    def to_json(self) -> str:
        """The result as JSON (what a family's process hands to the orchestrator)."""
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> FamilyResult:
        """Inverse of ``to_json``."""
        data = json.loads(text)
        data["rows"] = [Row(**r) for r in data.get("rows", [])]
        return cls(**data)


def median(values: Sequence[float]) -> float:
    """The median (0.0 for no values)."""
    return float(statistics.median(values)) if values else 0.0


def interleave(variants: Mapping[str, Callable[[], float]], repeats: int, warmup: int = 0) -> dict[str, list[float]]:
    """Run each variant ``repeats`` times in rotating order after ``warmup`` discarded rounds."""
    names = list(variants)
    results: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(warmup + repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            value = variants[name]()
            if round_ >= warmup:
                results[name].append(value)
    return results


def compare(group: str, results: dict[str, list[float]], unit: str, anchor: str, label: str) -> list[Row]:
    """Rows for one group, each with its median and its ratio to the anchor's median."""
    base = median(results[anchor])
    rows = []
    for name, values in results.items():
        value = median(values)
        rows.append(Row(group=group, variant=name, unit=unit, runs=[round(v, 4) for v in values],
                        median=round(value, 4), ratio=round(value / base, 4) if base else None,
                        ratio_label=label))
    return rows


def check(row: Row, op: str, limit: float, against: float | None = None, label: str = "") -> None:
    """Set ``row``'s target and whether it is met: ``row.ratio`` (or ``against``) ``op`` ``limit``."""
    value = row.ratio if against is None else against
    row.target = f"{label}{op} {limit:g}"
    if value is None:
        row.met = None
        return
    row.met = {"<=": value <= limit, ">=": value >= limit, "<": value < limit, ">": value > limit}[op]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, picked as the entrypoint picks its own (below the ephemeral range, not
    handed out to another job on this host lately)."""
    from entrypoint.lifecycle.startup.ports import free_ports

    return free_ports(1)[0]


def wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str, seconds: float = 30) -> None:
    """Until ``proc`` (a server we started) accepts connections on 127.0.0.1:``port``; RuntimeError naming ``what``
    if it exits or does not within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.1)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without any cluster variables, with this checkout first on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in _CLUSTER_VARS and not k.startswith(_CLUSTER_PREFIXES)}
    paths = [str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def devices_for(processes: int) -> dict[str, str]:
    """Hide the GPUs from a job of ``processes`` processes on this node when it has fewer GPUs than that."""
    from entrypoint.cluster.gpus import detect_gpu_count

    count = detect_gpu_count(os.environ.get("CUDA_VISIBLE_DEVICES"))
    return {} if count == 0 or count >= processes else {"CUDA_VISIBLE_DEVICES": ""}


PYTORCH_PYTHON = "BENCH_PYTORCH_PYTHON"  # the orchestrator tells every family the PyTorch venv's interpreter


def python() -> list[str]:
    """The interpreter of this family's venv."""
    return [sys.executable]


def pytorch_python() -> list[str]:
    """The PyTorch venv's interpreter (what the PyTorch image runs), whichever venv this family runs in."""
    return [os.environ.get(PYTORCH_PYTHON) or sys.executable]


def timed(commands: Sequence[tuple[list[str], dict[str, str]]], timeout: float = 900) -> float:
    """Start every command at once (one per node), wait for all; the wall seconds until the last exits.

    Output goes to files, not pipes: a process blocked on a full pipe would stall its peers' collectives.
    """
    with ExitStack() as stack:
        logs = [stack.enter_context(tempfile.TemporaryFile()) for _ in commands]
        started = time.perf_counter()
        procs = [subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
                 for (cmd, env), log in zip(commands, logs, strict=True)]
        try:
            codes = [p.wait(timeout=max(started + timeout - time.perf_counter(), 0.001)) for p in procs]
        except subprocess.TimeoutExpired:
            for p in procs:  # none left running (a GPU's memory with it) into the next measurement
                p.kill()
                p.wait()
            logs[0].seek(0)
            tail = logs[0].read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"{' '.join(commands[0][0])} did not finish within {timeout:g} s:\n{tail}") from None
        elapsed = time.perf_counter() - started
        for (cmd, _), code, log in zip(commands, codes, logs, strict=True):
            if code != 0:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-3000:]
                raise RuntimeError(f"{' '.join(cmd)} exited with {code}:\n{tail}")
    return elapsed


def versions() -> dict[str, str]:
    """Python and the frameworks installed in this venv (read from package metadata, nothing imported)."""
    from importlib import metadata

    found = {"python": sys.version.split()[0], "executable": sys.executable}
    for name in ("torch", "tensorflow", "tf_keras", "horovod"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found
