"""Keras checkpoints behind the same typed interface as PyTorch's writers (``checkpoints.CheckpointWriter``).

``save`` runs on every worker (MultiWorkerMirroredStrategy may run collectives while saving, so a save only the
chief entered would hang): the chief writes ``ckpt-<step>/weights`` and commits the marker last (whole beside the
place first, then swapped in: ``checkpoints.write_beside``, so a checkpoint of the same step already committed stays
loadable until the new one is), the others write into a scratch directory removed at once. With ``staging`` (gs://
checkpoints without the FUSE mount) TensorFlow writes and the chief commits in the local staging directory, then
uploads the checkpoint, marker last, before pruning on the store. Everything is synchronous: the blocked and written
seconds are equal.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from entrypoint.outputs.checkpoints import CheckpointWriter, Retention, check_sizes, commit, read_marker, write_beside
from entrypoint.outputs.staging import Staging
from entrypoint.outputs.storage import Location
from entrypoint.tensorflow.export import save_on_every_worker

WEIGHTS = "weights"  # the prefix of the files ``model.save_weights`` writes in a checkpoint


class KerasCheckpointIO:
    """Save a Keras model's weights (and optimizer) as a committed checkpoint; restore them into a model.

    ``local_dir`` is where TensorFlow writes checkpoints (the staging directory when staged, else the
    checkpoint directory itself); ``save`` and ``load`` take the checkpoint's final place (``path``).
    """

    def __init__(self, local_dir: Path, is_chief: bool, retention: Retention, staging: Staging | None = None) -> None:
        self.local_dir, self.is_chief, self.retention, self.staging = local_dir, is_chief, retention, staging
        self.blocked_seconds = 0.0
        self.write_seconds = 0.0

    def save(self, path: Location, state: Any, meta: dict[str, Any]) -> None:
        """Every worker saves the model ``state`` (a collective under MWMS); the chief commits ``path`` (uploads
        it when staged, marker last) and prunes."""
        started = time.monotonic()
        local = self.local_dir / path.name  # TensorFlow writes local (or /gcs) paths

        def save(directory: Path) -> None:
            directory.mkdir(parents=True, exist_ok=True)
            state.save_weights(str(directory / WEIGHTS))

        def write(directory: Path) -> None:
            save_on_every_worker(save, directory, self.is_chief)
            if self.is_chief:
                commit(directory, meta)
                check_sizes(directory)

        if not self.is_chief:
            write(local)  # into a scratch directory, removed at once
        else:
            # Written whole beside it first: a checkpoint of this step already committed (a rerun reached the same
            # step, a notice's save then the epoch's end) stays loadable until the new one is, then replaced
            write_beside(local, write)
            final: Location = self.staging.push_checkpoint(local) if self.staging is not None else local
            self.retention.verified(final)
            self.retention.prune(final.parent)
        elapsed = time.monotonic() - started
        self.blocked_seconds += elapsed
        self.write_seconds += elapsed

    def wait(self) -> None:
        """Nothing is ever in flight."""

    def check(self) -> None:
        """Nothing can have failed in the background."""

    def load(self, path: Location, model: Any) -> int:
        """Restore the committed checkpoint at ``path`` into ``model`` (from a downloaded copy when it is on a
        store); the epochs it had done."""
        local = self.staging.pull_checkpoint(path) if self.staging is not None else Path(str(path))
        model.load_weights(str(local / WEIGHTS)).expect_partial()
        return int(read_marker(path).get("epoch", 0))


_CONFORMS: type[CheckpointWriter] = KerasCheckpointIO  # mypy checks that it implements the interface
