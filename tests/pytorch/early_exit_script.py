"""A torchrun-style script: after meeting the chief, the worker (RANK 1) leaves early with ``os._exit(0)``;
the chief's next collective waits for it (gloo's timeout: 10 s)."""

import datetime
import os

import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
dist.barrier()
if os.environ["RANK"] == "1":
    print("worker leaving early with os._exit(0)", flush=True)
    os._exit(0)
dist.barrier()
dist.destroy_process_group()
