"""A torchrun-style script whose rank 0 ends with os._exit(0) right after the last collective (as benchmark
scripts do to skip the interpreter's finalization); the other ranks return normally a second later.

    torchrun --nproc-per-node 2 quick_exit_script.py
"""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(4))
dist.destroy_process_group()
print(f"rank {rank} leaves", flush=True)
if rank == 0:
    sys.stderr.flush()
    os._exit(0)
time.sleep(1)
