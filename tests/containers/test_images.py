"""Each locally built CPU image (make image-test): its smoke check, `describe`, the user and writable
directories, and its size against its budget (images/<name>/image.toml). Real containers, real ENTRYPOINT."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from entrypoint.lifecycle.startup.ports import free_ports
from tests.conftest import ROOT
from tests.containers.engine import OUT, UID, Container, catalog, common, run, sizes, vertex_spec, wheels, writable_dir

pytestmark = pytest.mark.containers
IMAGES = common.IMAGES
# What each image must import, with the versions of its lock (the build-time smoke check, and more), the example it
# describes and the strategy planned for it: images/<name>/image.toml ([cpu_facts], smoke_module, [tests] strategy).
SPECS = {image: catalog.image(image) for image in IMAGES}


def lock(image: str, package: str) -> str:
    version = wheels.lock_version(image, package)
    assert version, f"{package} is not in images/{image}/requirements-cpu.txt"
    return str(version)


@pytest.mark.parametrize("image", IMAGES)
def test_smoke_check_imports_the_locked_frameworks(engine: Any, built: Any, image: str) -> None:
    proc = run(Container(engine, built(image), ["-c", SPECS[image].cpu_facts], entrypoint="python"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    if image in ("pytorch", "horovod"):
        assert found["torch"] == f"{lock(image, 'torch')}+cpu"
        assert found["tensorboardX"] == lock(image, "tensorboardx")
    if image == "pytorch":
        assert found["cuda"] is None
    if image == "tensorflow":
        assert found["tensorflow"] == lock(image, "tensorflow")
        assert found["keras"].startswith("tf_keras")  # TF_USE_LEGACY_KERAS=1 is set in the image
    if image == "horovod":
        assert found["horovod"] == "0.28.1" and found["gloo"] and not found["nccl"]
        check = run(Container(engine, image, ["--check-build"], entrypoint="horovodrun"))
        assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("image", IMAGES)
def test_describe_plans_a_vertex_worker(engine: Any, built: Any, image: str) -> None:
    env = {"CLUSTER_SPEC": vertex_spec([2222, 2223], "workerpool1")}
    proc = run(Container(engine, built(image), ["-m", "entrypoint", "describe", "--module", SPECS[image].smoke_module],
                         env=env, entrypoint="python"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    described = json.loads(proc.stdout)
    topology, plan = described["topology"], described["plan"]
    assert (topology["source"], topology["role"], topology["node_rank"], topology["num_nodes"]) == \
        ("vertex", "worker", 1, 2)
    assert topology["chief_address"] == "127.0.0.1:2222"
    assert (plan["framework"], plan["strategy"], plan["world_size"]) == (image, SPECS[image].strategy, 2)
    tf_config = json.loads(described["env"]["TF_CONFIG"])
    assert tf_config["cluster"] == {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}
    if image == "horovod":
        assert described["env"]["HOROVOD_FUSION_THRESHOLD"] == str(128 * 1024 * 1024)


@pytest.mark.parametrize("image", IMAGES)
def test_the_entrypoint_answers_through_tini(engine: Any, built: Any, image: str) -> None:
    proc = run(Container(engine, built(image), ["--help"]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    inspect = engine.output("image", "inspect", "--format", "{{json .Config.Entrypoint}} {{.Config.User}}",
                            common.image_ref(image))
    assert inspect.split() == ['["/usr/bin/tini","-g","--","python","-m","entrypoint","run"]', str(UID)]


WHERE = [pytest.param(image, where, id=f"{image}-{where}") for image in IMAGES for where in ("vertex", "one-machine")]


@pytest.mark.parametrize(("image", "where"), WHERE)
def test_runs_as_the_trainer_user_and_can_write_where_trainers_write(
        engine: Any, built: Any, image: str, where: str, tmp_path: Path) -> None:
    """Through the ENTRYPOINT in script mode, as a single-replica Vertex job and as a plain `docker run`."""
    volume = writable_dir(tmp_path / "volume")
    env = {"CLUSTER_SPEC": vertex_spec(free_ports(1))} if where == "vertex" else {}
    probe = Container(engine, built(image), ["--script", "/probe/probe_dirs.py", "--", OUT], env=env,
                      volumes={volume: OUT, ROOT / "tests" / "containers": "/probe:ro"})
    proc = run(probe)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((volume / "probe.json").read_text())
    assert (report["uid"], report["gid"], report["user"], report["cwd"]) == (UID, UID, "trainer", "/app")
    assert report["is_chief"]
    assert report["writable"] == dict.fromkeys(report["writable"], True)
    assert report["hypertune_file_written"]


@pytest.mark.parametrize("image", IMAGES)
def test_image_size_is_within_its_budget(engine: Any, built: Any, image: str) -> None:
    ref = common.image_ref(built(image))
    size = sizes.image_size(engine, ref)
    layers = "\n".join(f"  {s / 1e6:9.1f} MB  {what[:100]}" for s, what in sizes.largest_layers(engine, ref))
    problem = sizes.budget_problem(image, size)
    assert problem is None, f"{problem}\nlargest layers:\n{layers}"
