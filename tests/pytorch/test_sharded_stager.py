"""The sharded writer saves more than once on a torch whose stager closes itself after every stage.

Seen on an H200 with torch 2.11 (bench/gpu_check.sh, docs/benchmarks.md): its ``DefaultStager`` closes its
``StateDictStager`` after each stage, which empties the copier's dispatch table, and the next stage of a DTensor
(whose pickled form names classes) failed with ``KeyError: <class 'type'>``: every sharded job died at its second
checkpoint. torch 2.13 keeps the stager open; here its ``_stage`` is given 2.11's closing step (the one line that
differs), and two saves of a sharded model must both commit, with the same shards. One process, gloo, CPU.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT, subprocess_env

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]

SCRIPT = """
import sys, torch, torch.distributed as dist
from pathlib import Path
from torch.distributed.checkpoint import staging
if sys.argv[3] == "closes":  # torch 2.11's DefaultStager._stage ends with self._state_dict_stager.close()
    stage = staging.DefaultStager._stage
    def closing(self, state_dict, **kwargs):
        staged = stage(self, state_dict, **kwargs)
        self._state_dict_stager.close()
        return staged
    staging.DefaultStager._stage = closing
from entrypoint.outputs import checkpoints
from entrypoint.pytorch.checkpoints import restore
from entrypoint.pytorch.checkpoints.sharded_io import ShardedCheckpointIO
from entrypoint.pytorch.loop import parallel
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
model = parallel.Sharded(parallel.Choice("fsdp", "test"), torch.device("cpu"), 1, 1, False, False).shard(
    model, lambda m: list(m))
optimizer = torch.optim.AdamW(model.parameters())
model(torch.randn(2, 4)).sum().backward()
optimizer.step()
io = ShardedCheckpointIO(1, 0, "async", 60, False)
for step in (1, 2, 3):
    meta = {"step": step, "epoch": 0, "batch": step, "sample": step, "framework": "pytorch", "world_size": 1,
            "sharded": True}
    io.save(checkpoints.checkpoint_path(Path(sys.argv[2]), step),
            {"shards": restore.sharded_state(model, optimizer), "extra": {}}, meta)
    io.wait()
    io.check()
io.close()
print("committed", [step for step, _ in checkpoints.committed(Path(sys.argv[2]))])
dist.destroy_process_group()
from entrypoint.lifecycle import shutdown
shutdown.end(0)  # as our processes end: gloo's threads must not meet finalization (SIGABRT)
"""


@pytest.mark.parametrize("stager", ["closes", "stays-open"], ids=["torch-2.11-stager", "torch-2.13-stager"])
def test_every_save_commits_whether_or_not_the_stager_closes_itself(tmp_path: Path, stager: str) -> None:
    proc = subprocess.run([PYTHON, "-c", SCRIPT, str(tmp_path / "store"), str(tmp_path / "ckpts"), stager], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "committed [3]", proc.stdout[-2000:]  # keep 1: the newest
