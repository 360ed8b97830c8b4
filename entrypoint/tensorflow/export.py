"""Collective-safe, chief-only saves: every worker saves (TF may need it), only the chief's copy is kept.

Checkpoints save through it in ``checkpoint_io.KerasCheckpointIO``; the final export is here.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


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


def export_model(model: Any, model_dir: Path, is_chief: bool) -> None:
    """Export a SavedModel the user can load back (``tf.keras.models.load_model``) into ``model_dir``."""
    save_on_every_worker(lambda target: model.save(str(target), save_format="tf"), model_dir, is_chief)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON, creating the parent directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=float))
