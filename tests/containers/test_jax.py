"""The JAX image as a Vertex AI job: two containers (chief and worker, a CLUSTER_SPEC each) train the tests' Keras 3
hooks module with 8 samples a replica, and the chief's export equals one container's at 16 (within 1e-5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from entrypoint.outputs import checkpoints
from tests.conftest import ROOT
from tests.containers.engine import OUT, Container, files_under, run, writable_dir
from tests.containers.test_jobs import vertex_job

pytestmark = pytest.mark.containers
HOOKS = ROOT / "tests" / "jax" / "tiny_hooks.py"
ARGS = ["--module", "tiny_hooks", "--epochs", "2", "--timeout", "120"]
COMPARE = """
import io, sys, zipfile, h5py, numpy as np
def weights(path):
    found = []
    with zipfile.ZipFile(path) as z, h5py.File(io.BytesIO(z.read("model.weights.h5")), "r") as h5:
        h5.visititems(lambda n, d: found.append(np.asarray(d)) if isinstance(d, h5py.Dataset) else None)
    return found
a, b = weights(sys.argv[1]), weights(sys.argv[2])
assert len(a) == len(b) > 0
print(max(float(np.max(np.abs(x - y))) for x, y in zip(a, b)))
"""


def test_jax_trains_across_two_containers_as_one_at_twice_the_batch(engine: Any, built: Any, tmp_path: Path) -> None:
    image = built("jax")
    code = {HOOKS: "/app/tiny_hooks.py:ro"}
    chief, worker = vertex_job(engine, image, [*ARGS, "--batch-size", "8"], tmp_path / "pair", mounts=code)
    summary = json.loads((chief / "model" / "training_summary.json").read_text())
    assert (summary["framework"], summary["strategy"], summary["world_size"]) == ("jax", "data_parallel", 2)
    assert summary["global_batch_size"] == 16 and checkpoints.committed(chief / "checkpoints")[-1][0] == 32
    assert files_under(worker) == []  # chief-only outputs: the worker's Orbax writes nothing, its export is scratch
    alone = writable_dir(tmp_path / "alone")
    proc = run(Container(engine, image, [*ARGS, "--batch-size", "16", "--job-dir", OUT],
                         volumes={alone: OUT, **code}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    diff = run(Container(engine, image, ["-c", COMPARE, "/a/model/model.keras", "/b/model/model.keras"],
                         volumes={chief: "/a:ro", alone: "/b:ro"}, entrypoint="python"))
    assert diff.returncode == 0, diff.stderr[-3000:]
    assert float(diff.stdout.strip().splitlines()[-1]) <= 1e-5
