"""A shard's write that fails with a full disk names the shard's file, wherever in the write it fails."""
from __future__ import annotations

import errno
from pathlib import Path

import pytest

pytest.importorskip("torch")

from entrypoint.pytorch.checkpoints.sharded_io import _writer

FULL = Path("/dev/full")  # every write to it fails with ENOSPC

pytestmark = pytest.mark.skipif(not FULL.exists(), reason="no /dev/full")


@pytest.mark.parametrize("size", [100, 1 << 20], ids=["at-the-last-flush", "in-a-write"])
def test_a_full_disk_names_the_shard_file(tmp_path: Path, size: int) -> None:
    """A small write sits in the buffer and fails only at the stream's close (torch.save's last bytes of a shard
    do): the error names the file all the same, not the checkpoint's directory with no file."""
    files = _writer(str(tmp_path)).fs
    with pytest.raises(OSError) as raised, files.create_stream(FULL, "wb") as stream:
        stream.write(b"x" * size)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(FULL)
