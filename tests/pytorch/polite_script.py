"""A script that polls the context API's preemption flag: on SIGTERM it saves and exits 143."""

import json
import sys
import time
from pathlib import Path

from entrypoint import context

out = Path(sys.argv[1])
for step in range(1, 100_000):
    time.sleep(0.05)
    print(f"script step {step}", flush=True)
    if context.preempted():
        out.write_text(json.dumps({"step": step, "rank": context.rank()}))
        sys.exit(143)
