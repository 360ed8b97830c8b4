"""Write what this process is to OUT/process-<RANK>.json (the fork server's tests compare a forked rank with an
exec'd one): its environment, command line, working directory, session, parent, random state and threads.

    run --nproc-per-node 2 --script tests/pytorch/process_probe.py -- OUT
"""

import json
import multiprocessing
import os
import random
import sys
import threading

import numpy
import torch

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
    parent = cmdline.read().split(b"\0")
probe = {
    "env": dict(os.environ), "argv": sys.argv, "orig_argv": sys.orig_argv, "cwd": os.getcwd(), "path": sys.path,
    "session_leader": os.getsid(0) == os.getpid(), "group_leader": os.getpgid(0) == os.getpid(),
    "parent": [part.decode() for part in parent[1:3]], "main": sys.modules["__main__"].__file__,
    "torch_seed": torch.initial_seed(), "torch_draw": torch.rand(1).item(), "python_draw": random.random(),
    "numpy_draw": float(numpy.random.rand()), "authkey": multiprocessing.current_process().authkey.hex(),
    "stdout_line_buffered": sys.stdout.line_buffering, "threads_named": sorted(t.name for t in threading.enumerate()),
}
with open(os.path.join(out, f"process-{os.environ['RANK']}.json"), "w") as f:
    json.dump(probe, f, indent=1, sort_keys=True)
