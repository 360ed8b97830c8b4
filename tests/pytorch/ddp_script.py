"""A plain torchrun-style DDP script with no import of the entrypoint: it must run unchanged.

    torchrun --nproc-per-node 2 ddp_script.py --out DIR
"""

import argparse
import hashlib
import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    dist.init_process_group(backend="gloo", init_method="env://")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(1234 + rank)  # different init per rank: DDP must broadcast rank 0's
    model = DistributedDataParallel(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(rank)
    true_w = torch.arange(8, dtype=torch.float32).unsqueeze(1) / 8
    for _ in range(args.steps):
        x = torch.randn(32, 8, generator=generator)
        loss = ((model(x) - x @ true_w) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    digests = [None] * world
    dist.all_gather_object(digests, digest)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "result.json"), "w") as f:
            json.dump({"world_size": world, "digests": digests, "loss": float(loss),
                       "local_rank": os.environ["LOCAL_RANK"], "master": os.environ["MASTER_ADDR"]}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
