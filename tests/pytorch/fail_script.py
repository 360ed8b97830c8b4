"""Rank 1 fails at once; rank 0 would otherwise wait a long time: the emulator must stop it."""

import os
import sys
import time

if os.environ.get("RANK") == "1":
    sys.exit(3)
time.sleep(120)
