"""A full disk during a sharded save (FSDP, every rank writing its shards) leaves no partial checkpoint: every rank
removes its own files, rank 0 the directory, and the job ends 74 naming the disk (docs/EXIT_CODES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pytorch.test_failures import mounted
from tests.runs import entrypoint, failure_records, failure_text, last_line

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]


def test_a_full_disk_during_a_sharded_save_leaves_no_partial_shards(tmp_path: Path) -> None:
    with mounted("tmpfs", tmp_path / "small") as small:
        proc = entrypoint("run", "--framework", "pytorch", "--job-dir", str(tmp_path), "--module",
                          "tests.pytorch.faults", "--nproc-per-node", "2", "--strategy", "fsdp", "--timeout", "60",
                          "--checkpoint-dir", str(small), "--epochs", "1", "--", "--hidden", "2048", timeout=600)
        left = sorted(str(p.relative_to(small)) for p in small.rglob("*"))
    assert proc.returncode == 74, failure_text(proc)
    assert left == []  # neither rank's shards nor the step's directory are left filling the disk
    assert "disk_full" in {record["class"] for record in failure_records(tmp_path)}
    assert last_line(proc).endswith("(exit 74, permanent)"), last_line(proc)
