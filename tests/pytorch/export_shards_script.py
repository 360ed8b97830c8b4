"""A torchrun-style script: FSDP2 over every rank (gloo), a model with row counts no world divides evenly, its
state streamed into model.safetensors by the entrypoint's export; rank 0 also saves the full state for comparison.

    entrypoint run --script tests/pytorch/export_shards_script.py --nproc-per-node 3 -- OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from entrypoint.pytorch.loop.export import row_shards, write_safetensors


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 6), torch.nn.Linear(6, 7), torch.nn.Linear(7, 1),
                                torch.nn.LayerNorm(1))
    model.register_buffer("scale", torch.arange(5, dtype=torch.float32))  # a buffer stays a plain tensor
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model[:2]:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        torch.save(full, out / "full.pt")
        streamed = sorted(name for name, value in model.state_dict().items() if row_shards(value) is not None)
        (out / "streamed.txt").write_text("\n".join(streamed))
    write_safetensors(model.state_dict(), out / "model.safetensors", dist.get_rank() == 0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
