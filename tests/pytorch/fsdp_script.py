"""An FSDP2 training script in torchtitan's style, run unchanged by the entrypoint (as by torchrun).

It reads only what torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT through ``env://``), builds a
device mesh, shards each block and then the root with ``fully_shard``, trains a few steps with AdamW, saves a
sharded checkpoint with ``torch.distributed.checkpoint`` and writes ``<argv[1]>/report.json`` on rank 0.
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert int(os.environ["LOCAL_RANK"]) >= 0
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)) for _ in range(3)))
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(64, 32, generator=g)
    losses = []
    for _ in range(20):
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, checkpoint_id=str(out / "checkpoint"))
    sharded = type(next(model.parameters())).__name__ == "DTensor"
    if rank == 0:
        (out / "report.json").write_text(json.dumps({"world_size": world, "sharded": sharded,
                                                     "loss_fell": losses[-1] < losses[0]}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
