"""Compare settings side by side in one run, on this machine, with real processes.

    python -m bench.compare            # DDP bucket_cap_mb 25 (torch default) vs 64 (our default)
    python -m bench.compare --horovod  # Horovod fusion threshold 64 MiB vs 128 MiB (our default)

Each configuration runs the same 2-process job (``--nproc-per-node 2``) ``--repeats`` times,
interleaved so machine noise hits both alike; the table reports the median samples/s the chief
measured. Numbers from a 2-core CPU box say little about NCCL on GPUs: run it there too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run_once(framework: str, extra: list[str], env: dict[str, str] | None) -> float:
    """One job; the chief's samples/s from its training summary."""
    with tempfile.TemporaryDirectory() as job_dir:
        cmd = [sys.executable, "-m", "entrypoint", "run", "--framework", framework, "--module", "bench.wide_mlp",
               "--nproc-per-node", "2", "--job-dir", job_dir, "--log-every", "100000", *extra]
        subprocess.run(cmd, check=True, capture_output=True, env=env)
        summary = json.loads((Path(job_dir) / "model" / "training_summary.json").read_text())
        return float(summary["samples_per_second"])


def main() -> None:
    """Run every configuration ``--repeats`` times, interleaved, and print a table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--horovod", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.horovod:
        framework = "horovod"
        configs = {"fusion 64 MiB": ["--fusion-threshold", str(64 << 20)],
                   "fusion 128 MiB (default)": ["--fusion-threshold", str(128 << 20)]}
    else:
        framework = "pytorch"
        configs = {"bucket 25 MB (torch default)": ["--bucket-cap-mb", "25"],
                   "bucket 64 MB (our default)": ["--bucket-cap-mb", "64"]}
    results: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(args.repeats):
        for name, extra in configs.items():
            results[name].append(run_once(framework, extra, None))
    print(f"{'configuration':<32} {'median samples/s':>18} {'runs':>30}")
    for name, values in results.items():
        runs = ", ".join(f"{v:.0f}" for v in values)
        print(f"{name:<32} {statistics.median(values):>18.0f} {runs:>30}")


if __name__ == "__main__":
    main()
