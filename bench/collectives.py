"""Gradient all-reduce settings side by side: DDP bucket 25 vs 64 MB, Horovod fusion 64 vs 128 MiB, Horovod vs DDP.

Every configuration runs the same 2-process hooks job (``bench.wide_mlp``, ``--nproc-per-node 2``) and
reports the samples/s the chief wrote in its training summary; all configurations are interleaved in one
set of rounds, so "Horovod vs DDP" compares our two defaults (DDP 64 MB, Horovod 128 MiB) from the very
same runs. Horovod rows need Horovod (``.venv/horovod``); without it only the DDP rows run. Numbers from a
2-core CPU box say little about NCCL on GPUs: run it there too.
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
from functools import partial
from pathlib import Path

from bench.common import FamilyResult, Row, clean_env, compare, devices_for, interleave, python, timed

DDP_25, DDP_64 = "DDP bucket 25 MB (torch default)", "DDP bucket 64 MB (our default)"
HVD_64, HVD_128 = "Horovod fusion 64 MiB", "Horovod fusion 128 MiB (our default)"
CONFIGS: dict[str, tuple[str, list[str]]] = {
    DDP_25: ("pytorch", ["--bucket-cap-mb", "25"]),
    DDP_64: ("pytorch", ["--bucket-cap-mb", "64"]),
    HVD_64: ("horovod", ["--fusion-threshold", str(64 << 20)]),
    HVD_128: ("horovod", ["--fusion-threshold", str(128 << 20)]),
}


def run_once(framework: str, extra: list[str], samples: int) -> float:
    """One 2-process job; the chief's samples/s from its training summary."""
    with tempfile.TemporaryDirectory() as job_dir:
        cmd = [*python(), "-m", "entrypoint", "run", "--framework", framework, "--module", "bench.wide_mlp",
               "--nproc-per-node", "2", "--job-dir", job_dir, "--log-every", "100000", *extra,
               "--", "--samples", str(samples)]
        timed([(cmd, clean_env(devices_for(2)))])
        summary = json.loads((Path(job_dir) / "model" / "training_summary.json").read_text())
        return float(summary["samples_per_second"])


def rows_for(group: str, results: dict[str, list[float]], names: tuple[str, str], note: str = "") -> list[Row]:
    """Two configurations compared, the first as the anchor."""
    rows = compare(group, {n: results[n] for n in names}, "samples/s", names[0], "x " + names[0].split(" (")[0])
    for row in rows:
        row.note = note
    return rows


def run(quick: bool) -> FamilyResult:
    """All configurations interleaved; ``quick``: a small data set, one round."""
    samples, repeats, warmup = (256, 1, 0) if quick else (8192, 3, 1)
    has_horovod = importlib.util.find_spec("horovod") is not None
    configs = {k: v for k, v in CONFIGS.items() if has_horovod or v[0] == "pytorch"}
    variants = {name: partial(run_once, fw, extra, samples) for name, (fw, extra) in configs.items()}
    results = interleave(variants, repeats, warmup)
    result = FamilyResult("collectives", "All-reduce settings (2 processes, samples/s, higher is better)")
    result.rows += rows_for("DDP bucket", results, (DDP_25, DDP_64))
    if has_horovod:
        result.rows += rows_for("Horovod fusion", results, (HVD_64, HVD_128))
        result.rows += rows_for("Horovod vs DDP", results, (DDP_64, HVD_128), "same runs as above")
    else:
        result.notes.append("Horovod is not installed in this venv: the Horovod rows need .venv/horovod")
    result.notes.append(f"bench.wide_mlp (~6M parameters, {samples} samples, batch 64 per process), "
                        f"--nproc-per-node 2 over gloo; {repeats} interleaved rounds after {warmup} warm-up; samples/s "
                        "over the whole loop (evaluation and the epoch-end checkpoint included); on CPU when the node "
                        "has fewer than 2 GPUs")
    return result
