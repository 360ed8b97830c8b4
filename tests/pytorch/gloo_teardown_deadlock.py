"""A torchrun-style DDP script whose gloo group is destroyed while one of its collectives is still running: the
teardown torch 2.13 deadlocks in. Rank 0 starts an all-reduce on a temporary tensor (the work owns the tensor's Python
object from then on), destroys the group and returns from ``main()``, which drops the model and with it the group's
last reference (DDP's reducer): ``~ProcessGroupGloo`` joins gloo's worker thread holding the GIL, and the worker,
freeing the work once rank 1 joins the all-reduce a second later, waits for the GIL. Each rank writes
OUT/done-<rank> once past the point where it would hang.

    torchrun --nproc-per-node 2 gloo_teardown_deadlock.py OUT
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    model = DistributedDataParallel(nn.Linear(8, 1))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(10), async_op=True)  # its future dropped: the work owns the tensor now
    else:
        time.sleep(1.0)  # rank 0 is in its group's destructor by now
        dist.all_reduce(torch.ones(10))
    dist.destroy_process_group()
    del model


out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
main()
if rank == 0:
    time.sleep(1.0)  # rank 1's all-reduce completes before rank 0 leaves
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"done-{rank}"), "w") as f:
    f.write("ok")
