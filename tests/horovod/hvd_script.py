"""An unmodified Horovod script (as in Horovod's own examples): hvd.init(), DistributedOptimizer, broadcasts.

It knows nothing of the entrypoint; it only reads its own arguments and Horovod's variables.
"""

import argparse
import hashlib
import json
import os

import horovod.torch as hvd
import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    hvd.init()
    torch.manual_seed(hvd.rank())  # different init per rank on purpose
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    generator = torch.Generator().manual_seed(hvd.rank())
    true_w = torch.arange(8, dtype=torch.float32).unsqueeze(1) / 8
    for _ in range(40):
        x = torch.randn(32, 8, generator=generator)
        loss = ((model(x) - x @ true_w) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    digests = hvd.allgather_object(digest)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump({"size": hvd.size(), "digests": digests, "loss": float(loss),
                   "fusion_threshold": os.environ.get("HOROVOD_FUSION_THRESHOLD"),
                   "cycle_time": os.environ.get("HOROVOD_CYCLE_TIME")}, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
