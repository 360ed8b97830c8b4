"""A script that reports its steps through ``entrypoint.context`` (the job ledger counts them): steps
``--from``..``--to``, failing after ``--fail-after`` when given."""

import argparse
import sys
import time

from entrypoint import context

parser = argparse.ArgumentParser()
parser.add_argument("--from", dest="first", type=int, default=1)
parser.add_argument("--to", type=int, default=20)
parser.add_argument("--fail-after", type=int, default=0)
args = parser.parse_args()
for step in range(args.first, args.to + 1):
    time.sleep(0.02)
    context.step_done(step)
    if step == args.fail_after:
        sys.exit(3)
