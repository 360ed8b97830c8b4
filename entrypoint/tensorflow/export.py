"""Collective-safe, chief-only saves: every worker saves (TF may need it), only the chief's copy is kept."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from entrypoint.checkpoints import checkpoint_path, commit


def save_on_every_worker(save: Callable[[Path], None], target: Path, is_chief: bool) -> None:
    """Run ``save`` on every worker: the chief writes ``target``, the others a private temp dir removed at once.

    MultiWorkerMirroredStrategy may run collectives while saving, so a save that only the chief
    entered would hang; the non-chief copies never reach shared storage (no ``workertemp_*``).
    """
    if is_chief:
        save(target)
        return
    scratch = Path(tempfile.mkdtemp(prefix="tf-nonchief-save-"))
    try:
        save(scratch / target.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def save_checkpoint(model: Any, checkpoint_dir: Path, step: int, is_chief: bool, meta: dict[str, Any]) -> Path:
    """Save the model's weights (and optimizer) as ``ckpt-<step>/weights``; the chief commits it last."""
    path = Path(str(checkpoint_path(checkpoint_dir, step)))  # TensorFlow writes local (or /gcs) paths
    if is_chief and path.exists():
        shutil.rmtree(path)  # a re-run reached the same step: replace, never mix two saves

    def save(directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        model.save_weights(str(directory / "weights"))

    save_on_every_worker(save, path, is_chief)
    if is_chief:
        commit(path, meta)
    return path


def export_model(model: Any, model_dir: Path, is_chief: bool) -> None:
    """Export a SavedModel the user can load back (``tf.keras.models.load_model``) into ``model_dir``."""
    save_on_every_worker(lambda target: model.save(str(target), save_format="tf"), model_dir, is_chief)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON, creating the parent directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=float))
