"""A script whose process vanishes at once (SIGKILL), as a node that keeps dying: for the restart budgets."""

import os
import signal

os.kill(os.getpid(), signal.SIGKILL)
