"""Every rank sleeps for a long time: only a forwarded signal ends the job early."""

import sys
import time

time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 120)
