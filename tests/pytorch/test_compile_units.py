"""``--compile`` under FSDP/HSDP compiles every shard unit, torch.nn's built-in ones too (``nn.Sequential``,
``nn.TransformerEncoderLayer``): ``unit.compile()`` compiled nothing for them, silently. One process, gloo, CPU."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT, subprocess_env

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]

SCRIPT = """
import functools, sys, torch, torch.distributed as dist
from torch import nn
from entrypoint.pytorch.loop import parallel
torch.compile = functools.partial(torch.compile, backend="eager")  # dynamo traces as under --compile, no C++ builds
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
torch.manual_seed(0)
if sys.argv[1] == "sequential":
    model, x = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(2)]), torch.randn(4, 8)
else:
    model = nn.Sequential(*[nn.TransformerEncoderLayer(8, 2, 16, batch_first=True) for _ in range(2)])
    x = torch.randn(4, 3, 8)
sharded = parallel.Sharded(parallel.Choice("fsdp", "test"), torch.device("cpu"), 1, 1, False, True)
model = sharded.shard(model, lambda m: list(m))
model(x).sum().backward()
print("compiled", parallel.compile_seconds() > 0)
dist.destroy_process_group()
from entrypoint.lifecycle import shutdown
shutdown.end(0)  # as our processes end: gloo's threads must not meet finalization (SIGABRT)
"""


@pytest.mark.parametrize("units", ["sequential", "transformer-encoder-layer"])
def test_compile_under_fsdp_compiles_built_in_shard_units(tmp_path: Path, units: str) -> None:
    proc = subprocess.run([PYTHON, "-c", SCRIPT, units, str(tmp_path / "store")], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "compiled True", proc.stdout[-2000:]
