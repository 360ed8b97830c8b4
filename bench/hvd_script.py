"""A small Horovod script (hvd.init, DistributedOptimizer, a few steps): the job the memory benchmark launches.

    horovodrun -np 2 -H localhost:2 --gloo python bench/hvd_script.py --steps 300
    python -m entrypoint run --framework horovod --nproc-per-node 2 --script bench/hvd_script.py -- --steps 300

With ``BENCH_PID_DIR`` set, each process writes an empty file named after its pid there.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import horovod.torch as hvd
import torch
from torch import nn


def main() -> None:
    """Join Horovod, train a small MLP on random data."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if os.environ.get("BENCH_PID_DIR"):
        (Path(os.environ["BENCH_PID_DIR"]) / str(os.getpid())).touch()
    hvd.init()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    for _ in range(args.steps):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    hvd.shutdown()


if __name__ == "__main__":
    main()
