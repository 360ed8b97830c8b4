"""A script whose child process ignores SIGTERM; the script waits for it.

``--new-session`` starts the child in its own session (as a daemon-style helper would)."""

import subprocess
import sys

child = ("import signal, time\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
         "print('child ready, ignoring SIGTERM', flush=True)\n"
         "time.sleep(600)\n")
proc = subprocess.Popen([sys.executable, "-c", child], start_new_session="--new-session" in sys.argv)
proc.wait()
