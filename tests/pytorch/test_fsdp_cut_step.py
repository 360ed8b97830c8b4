"""A survivor's FSDP model whose step a lost peer cut off is reset when its group is re-formed (``parallel.regroup``).

Seen in the chaos bench (docs/benchmarks.md, 2 nodes x 2 processes, FSDP healing from peer memory): right after the
heal a survivor aborted in gloo ("Received data size doesn't match expected size", SIGABRT) in the backward's
reduce-scatter. The survivor's model still held the cut step's state (units left unsharded, the forward order FSDP2
records for the backward's prefetch) that the replacement's fresh model did not, so their collectives differed.
Here one process (gloo, CPU) cuts a step off after its forward, re-forms, and the model must hold nothing of that
step: every unit sharded and idle, no forward order, no root of an iteration in flight; then it trains a step.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT, subprocess_env

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch]

SCRIPT = """
import sys, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from entrypoint.pytorch.loop import parallel
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
for unit in model:
    fully_shard(unit, reshard_after_forward=False)  # unsharded from its forward to its backward
fully_shard(model)
mesh = model[0]._get_fsdp_state()._fsdp_param_group.mesh_info.mesh
state = model._get_fsdp_state()
model(torch.randn(4, 8)).sum()  # the step is cut off here: no backward, no optimizer step
groups = [g for s in state._state_ctx.all_states for g in s._fsdp_param_groups]
print("after the cut:", len(state._comm_ctx.post_forward_order), any(g.is_sharded for g in groups))
parallel.regroup(model, mesh)
print("after the re-form:", len(state._comm_ctx.post_forward_order), state._state_ctx.iter_forward_root is not None,
      sorted({g._training_state.name for g in groups}), all(g.is_sharded for g in groups))
model(torch.randn(4, 8)).sum().backward()
print("trained:", all(p.grad is not None for p in model.parameters()))
"""


def test_a_step_cut_off_by_a_lost_peer_leaves_nothing_in_the_sharded_model_once_the_group_is_re_formed(
        tmp_path: Path) -> None:
    proc = subprocess.run([PYTHON, "-c", SCRIPT, str(tmp_path / "store")], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "after the cut: 2 False" in proc.stdout, proc.stdout  # what it left: 2 units' forward order, unsharded
    assert "after the re-form: 0 False ['IDLE'] True" in proc.stdout, proc.stdout
    assert "trained: True" in proc.stdout, proc.stdout
