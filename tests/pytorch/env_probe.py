"""Write this process's environment to OUT/env-<RANK>.json: what a launcher (torchrun or ours) gave the script.

    torchrun --nproc-per-node 2 env_probe.py OUT
"""

import json
import os
import sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"env-{os.environ['RANK']}.json"), "w") as f:
    json.dump(dict(os.environ), f, indent=1, sort_keys=True)
