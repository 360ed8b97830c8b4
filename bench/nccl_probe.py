"""One all-reduce over the job's process group, as a training script starts it: what NCCL made of the environment.

    python -m entrypoint run --framework pytorch --script bench/nccl_probe.py -- /tmp/probe.json

``bench/gpu_check.sh`` runs it on a GPU machine under each fabric setting (a stray ``NCCL_NET=gIB`` with
``--fabric off`` and with the default, a fake TCPXO tree sourced). Rank 0 writes to ``argv[1]``: whether the
all-reduce gave the sum, NCCL's version, which NCCL core the process loaded (``/proc/self/maps``), the names of the
``NCCL_*`` variables it saw (values only for ``NCCL_NET``, never the others: a profile's may be secret), the first
``LD_LIBRARY_PATH`` entry, and the error, if any, which is then raised again for the entrypoint to classify.
Without CUDA it does the same over gloo on CPU (how it is tested off a GPU).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def loaded_nccl() -> list[str]:
    """The NCCL libraries this process has mapped (the core and any net or tuner plugin)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in maps.splitlines() if "nccl" in line.rsplit("/", 1)[-1]})


def main() -> None:
    """Start the process group, all-reduce once, write what was seen."""
    out = Path(sys.argv[1])
    cuda = torch.cuda.is_available()
    rank = int(os.environ.get("RANK", "0"))
    seen: dict[str, Any] = {
        "rank": rank, "world_size": int(os.environ.get("WORLD_SIZE", "1")), "backend": "nccl" if cuda else "gloo",
        "nccl_variables": sorted(n for n in os.environ if n.startswith("NCCL_")),
        "NCCL_NET": os.environ.get("NCCL_NET"),
        "ld_library_path_first": os.environ.get("LD_LIBRARY_PATH", "").split(":")[0],
        "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
    }
    started = time.perf_counter()
    try:
        if cuda:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", device_id=device)  # NCCL's communicator now, not at the first collective
        else:
            device = torch.device("cpu")
            dist.init_process_group("gloo")
        value = torch.full((1 << 20,), float(rank + 1), device=device)
        dist.all_reduce(value)
        if cuda:
            torch.cuda.synchronize()
        world = dist.get_world_size()
        seen.update(ok=bool(value[0].item() == world * (world + 1) / 2), sum=float(value[0].item()))
    except Exception as exc:
        seen.update(ok=False, error=f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:3000])
        raise
    finally:
        seen.update(seconds=round(time.perf_counter() - started, 3), loaded=loaded_nccl())
        if rank == 0:
            out.write_text(json.dumps(seen, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
