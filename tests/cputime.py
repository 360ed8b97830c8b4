"""The CPU time of each test, with the processes it started (pytest plugin; `make test` sets TEST_CPU_LOG).

Two cores bound `make test` by the CPU its tests spend, not by their wall time (a test that waits on a job's
timeout costs little; one that starts five replicas costs seconds of CPU in each). With ``TEST_CPU_LOG`` set, every
test appends one JSON line there: its node id, wall seconds, CPU seconds (this process's own plus that of every
process it started and waited for: RUSAGE_CHILDREN counts a child's waited-for children too), when it ended and on
which xdist worker. ``tests/tiers.py table --cpu N`` prints the N tests that spent most (docs/testing.md).
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator

import pytest

from tests.tiers import children_cpu

LOG = "TEST_CPU_LOG"


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime + children_cpu()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, None]:
    path = os.environ.get(LOG)
    if not path:
        yield
        return
    cpu, wall = cpu_seconds(), time.monotonic()
    yield
    line = {"test": item.nodeid, "wall": round(time.monotonic() - wall, 2), "cpu": round(cpu_seconds() - cpu, 2),
            "end": round(time.time(), 2), "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}
    with open(path, "a", encoding="utf-8") as log:  # one short write per line: whole under O_APPEND
        log.write(json.dumps(line) + "\n")
