"""A script whose rank 0 leaves a process behind (its child's child, holding the job's output open, as a DataLoader
worker that never started did) and ends; rank 1 ends at once. The node must not wait for what rank 0 left.

    python orphan_script.py PIDFILE
"""

import os
import sys
import time

if os.environ.get("RANK") == "0":
    if os.fork() == 0:  # the child starts the one left behind and ends: it is nobody's child but the adopter's
        if os.fork() == 0:
            with open(sys.argv[1], "w") as pid:
                pid.write(str(os.getpid()))
            time.sleep(300)
            os._exit(0)
        os._exit(0)
    os.wait()
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
print(f"rank {os.environ.get('RANK')} leaves", flush=True)
sys.exit(3 if os.environ.get("RANK") == "0" else 0)
