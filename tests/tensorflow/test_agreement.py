"""The agreement behind every TensorFlow stop and notice (``entrypoint/tensorflow/agreement.py``), with real
MultiWorkerMirrored workers on 127.0.0.1 and TensorFlow's own coordination service: events heard on any worker at
random points, the workers drifting up to a point apart, are acted on by all of them at the same point."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from entrypoint.lifecycle.startup.ports import free_ports
from tests.conftest import PYTHON, ROOT, subprocess_env

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]
PROBE = Path(__file__).with_name("agreement_probe.py")
WORKERS, POINTS = 3, 300


def probe(seed: int) -> list[dict[str, list[list[object]]]]:
    """Every worker's JSON report, in worker order."""
    ports = ",".join(map(str, free_ports(WORKERS)))
    procs = [subprocess.Popen([PYTHON, str(PROBE), str(i), str(seed), str(POINTS), ports], cwd=ROOT,
                              env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(WORKERS)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


@pytest.mark.parametrize("seed", [1, 2])
def test_every_worker_acts_on_every_event_at_the_same_point(seed: int) -> None:
    reports = probe(seed)
    acted = reports[0]["acted"]
    assert all(report["acted"] == acted for report in reports), [len(r["acted"]) for r in reports]
    points = [int(a[0]) for a in acted]
    assert points == sorted(points)
    stopper, stop_point = reports[0]["stop"]
    stops = [a for a in acted if a[1] == "stop"]
    assert stops == [[stop_point + 1, "stop", f"SIGTERM on worker {stopper}"]]  # the point after the one it came at
    notices = {int(a[0]) for a in acted if a[1] == "notice"}
    heard = {int(h[0]) for report in reports for h in report["heard"] if h[1] == "notice"}
    # every notice acted on, once per point, at the point after it was heard (the last point has none after it)
    assert notices == {p + 1 for p in heard if p < POINTS}
    assert len(notices) >= 40, len(notices)  # about 0.27 x 300 points hear one
