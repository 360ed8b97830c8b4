"""Two containers of one image as a Vertex AI job: chief (workerpool0) and worker (workerpool1), each with
its own CLUSTER_SPEC on the host network, its own output volume mounted at the same path, and the AIP_*
variables Vertex sets. Training happens in step and only the chief's volume receives outputs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from entrypoint.lifecycle.startup.ports import free_ports
from entrypoint.outputs import checkpoints
from tests.conftest import ROOT
from tests.containers.engine import (
    OUT,
    Container,
    aip_dirs,
    common,
    files_under,
    started,
    supply_chain,
    vertex_spec,
    writable_dir,
)
from tests.horovod.keras_callbacks_check import SCRIPT, check_callbacks
from tests.tensorflow.runs import make_image_folder

pytestmark = pytest.mark.containers
POOLS = ("workerpool0", "workerpool1")  # chief, worker


def vertex_job(engine: Any, image: str, args: list[str], tmp_path: Path,
               mounts: dict[Path, str] | None = None, env: dict[str, str] | None = None) -> tuple[Path, Path]:
    """Run a chief and a worker container to completion; return their output volumes (host paths)."""
    ports = free_ports(2)
    volumes = [writable_dir(tmp_path / pool) for pool in POOLS]
    containers = [
        Container(engine, image, args, env={"CLUSTER_SPEC": vertex_spec(ports, pool), **aip_dirs(), **(env or {})},
                  volumes={volume: OUT, **(mounts or {})})
        for pool, volume in zip(POOLS, volumes, strict=True)
    ]
    with started(*containers, logs=tmp_path) as (chief, worker):
        codes = [worker.wait(), chief.wait()]
        assert codes == [0, 0], f"exit codes worker, chief: {codes}\n{chief.tail()}\n{worker.tail()}"
    return volumes[0], volumes[1]


def test_pytorch_digits_trains_ddp_across_two_containers(engine: Any, built: Any, tmp_path: Path) -> None:
    pinned = f"localhost/trainer-pytorch@{supply_chain.image_digest(engine, common.image_ref('pytorch'))}"
    chief, worker = vertex_job(engine, built("pytorch"), ["--module", "trainers.digits_torch", "--epochs", "3",
                                                          "--timeout", "120"], tmp_path,
                               env={"TRAINER_IMAGE": pinned})  # as job vertex writes it for a pinned image
    summary = json.loads((chief / "model" / "training_summary.json").read_text())
    sbom = supply_chain.keep_sbom(engine, "pytorch", "cpu").read_bytes()
    assert summary["image"] == {"reference": pinned, "digest": pinned.rpartition("@")[2],
                                "sbom": "/usr/share/trainer/sbom.cdx.json", "packages": summary["image"]["packages"],
                                "sbom_sha256": hashlib.sha256(sbom).hexdigest()}  # what ran, and what is in it
    assert summary["world_size"] == 2 and summary["ranks"] == [0, 1]
    assert summary["param_digests"][0] == summary["param_digests"][1]  # in step: the same weights on both
    assert summary["final_step"] == summary["expected_steps"] > 0
    assert {"model.pt", "state_dict.pt"} <= set(files_under(chief / "model"))
    assert checkpoints.committed(chief / "checkpoints")[-1][0] == summary["final_step"]
    assert list((chief / "logs").glob("events.out.tfevents.*"))
    assert files_under(worker) == []  # chief-only outputs


def test_tensorflow_codelab_script_trains_multiworker_mirrored(engine: Any, built: Any, tmp_path: Path) -> None:
    data = make_image_folder(tmp_path / "flowers")
    codelab = ROOT / "tests" / "tensorflow" / "codelab_task.py"
    args = ["--script", "/code/codelab_task.py", "--timeout", "120", "--",
            "--data-dir", "/data", "--output-dir", f"{OUT}/model", "--epochs", "2"]
    chief, worker = vertex_job(engine, built("tensorflow"), args, tmp_path,
                               mounts={data: "/data:ro", codelab: "/code/codelab_task.py:ro"})
    saved = chief / "model" / "multi-machine-output"
    assert (saved / "saved_model.pb").is_file(), files_under(chief)
    assert files_under(worker) == []  # the worker's workertemp_ copy is gone, nothing else was written


def test_horovod_digits_trains_across_two_containers(engine: Any, built: Any, tmp_path: Path) -> None:
    chief, worker = vertex_job(engine, built("horovod"), ["--module", "trainers.digits_horovod", "--timeout", "120",
                                                          "--", "--epochs", "3"], tmp_path)
    metrics = json.loads((chief / "model" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["steps"] > 0 and metrics["accuracy"] > 0.5
    assert "state_dict.pt" in files_under(chief / "model")
    assert files_under(worker) == []


def test_horovod_keras_example_with_every_callback_across_two_containers(engine: Any, built: Any,
                                                                          tmp_path: Path) -> None:
    script = ROOT / SCRIPT
    args = ["--script", "/code/hvd_keras_callbacks.py", "--timeout", "120", "--", "--out", f"{OUT}/keras"]
    chief, worker = vertex_job(engine, built("horovod"), args, tmp_path,
                               mounts={script: "/code/hvd_keras_callbacks.py:ro"})
    check_callbacks(json.loads((chief / "keras" / "callbacks.json").read_text()), chief / "keras")
    assert files_under(worker) == []
