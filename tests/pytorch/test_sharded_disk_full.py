"""A full disk during a sharded save (FSDP, every rank writing its shards) leaves no partial checkpoint: every rank
removes its own files, rank 0 the directory, and the job ends 74 naming the disk (docs/EXIT_CODES.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from entrypoint.outputs import checkpoints
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


def test_a_disk_that_fills_at_a_later_sharded_save_is_disk_full_even_with_room_left_after(tmp_path: Path) -> None:
    """Three checkpoints fit, the fourth does not (retention keeps three): a shard's write fails with ENOSPC inside
    torch.distributed.checkpoint, whose torch.save turns it into "unexpected pos"; once the partial shards are
    removed the disk has room again, so only the write's own error tells. Every rank ends 74 naming the shard, not
    1 with a torch traceback, and the committed checkpoints are whole."""
    with mounted("tmpfs", tmp_path / "small") as small:
        subprocess.run(["mount", "-o", "remount,size=20m", str(small)], check=True)
        proc = entrypoint("run", "--framework", "pytorch", "--job-dir", str(tmp_path), "--module",
                          "tests.pytorch.faults", "--nproc-per-node", "2", "--strategy", "fsdp", "--timeout", "60",
                          "--checkpoint-dir", str(small), "--epochs", "1", "--checkpoint-every", "5", "--",
                          "--hidden", "9000", timeout=600)
        kept = checkpoints.committed(small)
        for _step, path in kept:
            checkpoints.verify(path)
        left = sorted(p.name for p in small.iterdir())
    assert proc.returncode == 74, failure_text(proc)
    assert [step for step, _path in kept] == [5, 10, 15] and left == ["ckpt-00000005", "ckpt-00000010",
                                                                      "ckpt-00000015"]
    line = last_line(proc)
    assert line.startswith("entrypoint: error: disk_full on ") and "no space left on device at " in line, line
    assert "/.partial-ckpt-00000020/__" in line and line.endswith("(exit 74, permanent)"), line
    assert {record["class"] for record in failure_records(tmp_path)} == {"disk_full"}
