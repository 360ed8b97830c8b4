"""A sharded checkpoint written again at a step that has one (a rerun that reached it, a notice's save then the
epoch's end): every rank writes beside it and the chief swaps the new one in once committed, so the committed one
stays loadable whatever ends the job in between (here the platform's SIGKILL of the chief before its commit). No
rank creates the step's directory before the chief cleared what an earlier attempt left (the flake of a world-3
resume: a rank's ``FileExistsError`` while the chief removed the directory it was creating). Two processes, gloo,
CPU, the real writer."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from entrypoint.outputs import checkpoints
from tests.conftest import PYTHON, ROOT, subprocess_env

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]

SCRIPT = """
import os, signal, sys, torch, torch.distributed as dist
from pathlib import Path
from entrypoint.outputs import checkpoints
from entrypoint.pytorch.checkpoints.sharded_io import ShardedCheckpointIO
store, ckpts, rank, phase = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
if phase == "killed" and rank == 0:  # the platform's kill as the chief is about to commit the rewrite
    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    checkpoints.commit = killed
value = {"first": 1.0, "killed": 2.0, "again": 3.0}[phase]
io = ShardedCheckpointIO(2, rank, "async", 30, False)
meta = {"step": 3, "epoch": 0, "batch": 3, "sample": 3, "framework": "pytorch", "world_size": 2, "sharded": True,
        "phase": phase}
io.save(checkpoints.checkpoint_path(ckpts, 3), {"shards": {f"w{rank}": torch.full((64,), value)}, "extra": {}},
        meta)
io.close()
print("saved", phase, flush=True)
dist.destroy_process_group()
from entrypoint.lifecycle import shutdown
shutdown.end(0)  # as our processes end: gloo's threads must not meet finalization (SIGABRT)
"""


def save(tmp_path: Path, phase: str) -> list[subprocess.Popen[str]]:
    store = tmp_path / f"store-{phase}"
    return [subprocess.Popen([PYTHON, "-c", SCRIPT, str(store), str(tmp_path / "ckpts"), str(rank), phase], cwd=ROOT,
                             env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for rank in (0, 1)]


def test_a_sharded_rewrite_killed_before_its_commit_leaves_the_committed_step_loadable(tmp_path: Path) -> None:
    ranks = save(tmp_path, "first")
    for proc in ranks:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
    target = checkpoints.checkpoint_path(tmp_path / "ckpts", 3)
    assert checkpoints.read_marker(target)["phase"] == "first"

    chief, other = save(tmp_path, "killed")
    chief.communicate(timeout=300)
    assert chief.returncode == -signal.SIGKILL
    os.kill(other.pid, signal.SIGKILL)  # the platform takes the whole job
    other.communicate(timeout=60)
    checkpoints.verify(target)  # the committed step, whole, as it was
    assert checkpoints.read_marker(target)["phase"] == "first"
    assert checkpoints.latest(tmp_path / "ckpts") == target

    ranks = save(tmp_path, "again")  # the rerun reaches the step again: the partial rewrite is replaced
    for proc in ranks:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
    checkpoints.verify(target)
    marker = checkpoints.read_marker(target)
    assert marker["phase"] == "again"
    assert sorted(marker["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp", "extra.pt"]
    assert sorted(p.name for p in (tmp_path / "ckpts").iterdir()) == ["ckpt-00000003"]  # nothing left beside
