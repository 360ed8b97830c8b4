"""A module a node's fork server runs in tests/pytorch/test_fork_server.py: writes OUT.json (its pid, whether torch
was imported before it ran), then ends as asked: ``exit N``, ``wait`` (until a signal: SIGTERM writes OUT.term and
exits 7; others kill it), or ``raise SIGNAL`` (kills itself with it)."""

import json
import os
import signal
import sys
import time

out, how = sys.argv[1], sys.argv[2:]


def _stopped(sig: int, _frame: object) -> None:
    with open(out + ".term", "w") as f:
        f.write(str(sig))
    sys.exit(7)


signal.signal(signal.SIGTERM, _stopped)
with open(out + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "torch_preloaded": "torch._dynamo" in sys.modules, "argv": sys.argv,
               "orig_argv": sys.orig_argv, "cwd": os.getcwd(),
               "attempt": os.environ.get("TRAINER_ATTEMPT")}, f)
os.rename(out + ".tmp", out + ".json")
print("target says hello", flush=True)
if how[0] == "exit":
    sys.exit(int(how[1]))
if how[0] == "raise":
    os.kill(os.getpid(), getattr(signal, how[1]))
while True:
    time.sleep(0.05)
