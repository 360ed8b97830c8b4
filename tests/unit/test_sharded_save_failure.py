"""A sharded save cut off by a lost peer fails as that peer's loss, even on a store: survivors recover from it
(``failures.is_peer_lost``), where wrapping it as the store's failure ended the job with ``storage_unavailable``
(exit 197, the bucket blamed) while the bucket was fine. Any other failure of a save to a store stays the store's."""

from __future__ import annotations

import pytest

from entrypoint import failures
from entrypoint.errors import PeerError
from entrypoint.outputs.storage import RemotePath, StorageError

pytest.importorskip("torch")


def writer() -> object:
    from entrypoint.pytorch.checkpoints.sharded_io import ShardedCheckpointIO

    return ShardedCheckpointIO(keep=2, rank=1, mode="async", timeout=10.0, cuda=False)  # rank 1: removes nothing


def test_a_save_cut_off_by_a_lost_peer_fails_as_the_peer_not_the_store() -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    path = RemotePath("gs://bucket/job/checkpoints/ckpt-00000006")
    lost = PeerError("rank 2 stopped responding")
    assert writer()._failure(path, lost) is lost  # type: ignore[attr-defined]
    # the same loss met inside torch.distributed.checkpoint.save (one rank's error in its CheckpointException)
    cut = CheckpointException("save failed", {0: (lost, None)})  # type: ignore[dict-item]
    found = writer()._failure(path, cut)  # type: ignore[attr-defined]
    assert found is lost and failures.is_peer_lost(found)


def test_any_other_failure_of_a_save_to_a_store_is_the_stores() -> None:
    path = RemotePath("gs://bucket/job/checkpoints/ckpt-00000006")
    found = writer()._failure(path, RuntimeError("upload refused"))  # type: ignore[attr-defined]
    assert isinstance(found, StorageError) and failures.classify(found).cls.name == "storage_unavailable"
