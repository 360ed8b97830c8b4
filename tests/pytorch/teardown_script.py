"""A torchrun-style script that ends the way DDP training ends, with the teardown torch 2.13's gloo aborts in.

Rank 0's last collective is started during backward and only its future is kept (as DDP does with its gradient
all-reduce), so gloo's worker thread frees the work; the other ranks join it on a temporary tensor, which the
work owns from then on. If a worker thread frees its work while its interpreter is finalizing, the process ends
with "terminate called without an active exception" (SIGABRT) after the script returned normally. The ranks of
the last node then work LATE seconds longer (a slow upload, say); each rank writes OUT/done-<rank>.json last.

    torchrun --nproc-per-node 2 teardown_script.py OUT [LATE]
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

out, late = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dist.barrier()
if rank == 0:
    weight, futures = torch.ones(1, requires_grad=True), []
    weight.register_hook(lambda grad: (futures.append(dist.all_reduce(torch.ones(10), async_op=True).get_future()),
                                       grad)[1])
    (weight * 2).sum().backward()
    futures[0].wait()
else:
    dist.all_reduce(torch.ones(10))
if rank >= world - int(os.environ["LOCAL_WORLD_SIZE"]):
    time.sleep(late)
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"done-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "time": time.time()}, f)
