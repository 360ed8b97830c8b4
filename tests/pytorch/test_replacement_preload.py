"""A replacement of a lost node imports what placing its model and building its optimizer need before it announces
itself (``parallel.preload``: ``torch._dynamo``, which a torch.optim optimizer's construction imports, and a sharded
layout's modules), so the survivors do not wait 1.5-3.5 s of imports after taking it in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.pytorch

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("strategy", "sharded"), [("fsdp", True), ("hsdp", True), ("ddp", False)])
def test_what_placing_the_model_imports_is_imported_before_the_model_is_placed(strategy: str, sharded: bool) -> None:
    code = ("import sys, torch; from entrypoint.pytorch.loop import parallel; "
            "before = [m in sys.modules for m in ('torch._dynamo', 'torch.distributed.fsdp')]; "
            "parallel.preload(sys.argv[1]); "
            "print(*before, 'torch._dynamo' in sys.modules, 'torch.distributed.fsdp' in sys.modules, "
            "'torch.distributed.tensor' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, strategy], cwd=REPO, capture_output=True, text=True, check=True)
    before_dynamo, before_fsdp, dynamo, fsdp, tensor = out.stdout.split()
    assert (before_dynamo, before_fsdp, dynamo) == ("False", "False", "True")
    assert not sharded or (fsdp, tensor) == ("True", "True")  # (torch._dynamo imports FSDP's modules itself)
