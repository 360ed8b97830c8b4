"""Writes what a training process sees of the fabric step to argv[1] (tests/pytorch/test_fabric_run.py)."""

import json
import os
import sys

NAMES = ("NCCL_NET", "NCCL_TUNER_CONFIG_PATH", "NCCL_CROSS_NIC", "LD_LIBRARY_PATH", "TRAINER_FABRIC_APPLIED", "RANK")
with open(f"{sys.argv[1]}.{os.environ.get('RANK', '0')}", "w") as out:
    json.dump({name: os.environ.get(name) for name in NAMES}, out)
