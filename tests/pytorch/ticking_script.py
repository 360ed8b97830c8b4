"""A rank that says its pid, then ticks every 20 ms with the time (the fork server's tests: no tick after a kill).

    run --nproc-per-node 2 --script tests/pytorch/ticking_script.py
"""

import os
import time

rank = int(os.environ["RANK"])
print(f"rank {rank} pid {os.getpid()} parent {os.getppid()}", flush=True)
for n in range(30_000):
    print(f"rank {rank} tick {n} {time.time():.3f}", flush=True)
    time.sleep(0.02)
