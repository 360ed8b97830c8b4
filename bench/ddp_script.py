"""A small torchrun-style DDP script (init_process_group from env://, a few steps): what launch overhead is timed on.

    torchrun --nproc-per-node 1 bench/ddp_script.py --steps 20
    python -m entrypoint run --framework pytorch --script bench/ddp_script.py -- --steps 20

With ``BENCH_PID_DIR`` set, each process writes an empty file named after its pid there, so the memory
benchmark can tell training processes from the launcher's own.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    """Join the group, train a small MLP on random data, leave the group."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if os.environ.get("BENCH_PID_DIR"):
        (Path(os.environ["BENCH_PID_DIR"]) / str(os.getpid())).touch()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    for _ in range(args.steps):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


def leave() -> None:
    """Exit without the interpreter's finalization, where torch 2.13's gloo can abort a finished run.

    DDP keeps the process group's threads alive past ``destroy_process_group``; one of them freeing a finished
    collective during finalization aborts the process (docs/ARCHITECTURE.md, "Process exit"), so a bare
    ``torchrun`` run could fail for it. Under the entrypoint (``TRAINER_PLAN_FILE`` set) the script returns:
    the entrypoint ends its processes that way itself, after its exit barrier, and that is part of what is timed.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    if not os.environ.get("TRAINER_PLAN_FILE"):
        leave()
