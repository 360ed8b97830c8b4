"""Imported at interpreter start: the replica named by TEST_HANG_REPLICA hangs before it does anything,
so it never reaches the start-up barrier (a node stuck before the entrypoint's own code runs, e.g. on a mount)."""

import os
import sys
import time

if os.environ.get("TRAINER_REPLICA") and os.environ.get("TRAINER_REPLICA") == os.environ.get("TEST_HANG_REPLICA") \
        and sys.argv[1:2] == ["run"]:
    print("hanging before the barrier", flush=True)
    while True:
        time.sleep(3600)
