"""A replacement of a lost node imports what placing a sharded model needs before it announces itself
(``parallel.preload``), so the survivors do not wait 1-2 s of imports after taking it in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("strategy", "imported"), [("fsdp", True), ("hsdp", True), ("ddp", False)])
def test_a_sharded_layout_s_modules_are_imported_before_the_model_is_placed(strategy: str, imported: bool) -> None:
    code = ("import sys, torch; from entrypoint.pytorch.loop import parallel; "
            "before = 'torch.distributed.fsdp' in sys.modules; said = parallel.preload(sys.argv[1]); "
            "print(before, 'torch.distributed.fsdp' in sys.modules, 'torch.distributed.tensor' in sys.modules, "
            "bool(said))")
    out = subprocess.run([sys.executable, "-c", code, strategy], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", str(imported), str(imported), str(imported)]
