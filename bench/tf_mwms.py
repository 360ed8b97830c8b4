"""TensorFlow MultiWorkerMirrored: the codelab-style script through the entrypoint vs started by hand with TF_CONFIG.

The Vertex codelab's ``task.py`` (``tests/tensorflow/codelab_task.py``, unchanged) trains on a folder of
synthetic images with 2 workers:

- by hand: two processes, each with the TF_CONFIG Vertex would set (``chief`` + ``worker``) written by
  hand, and ``TF_USE_LEGACY_KERAS=1`` (Keras 3's ``fit`` fails under MultiWorkerMirrored in TF 2.21);
- through the entrypoint: ``python -m entrypoint local --workers 2 -- run --framework tensorflow --script``.

Throughput is images trained per second of the job's wall time (start-up included, so it is strict).
Target: the entrypoint at least 0.98 of the hand-started job.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from bench.common import REPO, FamilyResult, check, clean_env, compare, free_port, interleave, python, timed

CODELAB = str(REPO / "tests" / "tensorflow" / "codelab_task.py")


def image_folder(root: Path, per_class: int, size: int = 32, classes: int = 3) -> Path:
    """``classes`` folders of random PNG images (what image_dataset_from_directory reads)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = root / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            image[..., c] = 255 // (c + 1)  # a learnable hint per class
            Image.fromarray(image).save(folder / f"{i}.png")
    return root


def by_hand(data: Path, epochs: int) -> float:
    """Two processes with a hand-written TF_CONFIG (chief + worker)."""
    cluster = {"chief": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}"]}
    with tempfile.TemporaryDirectory() as out:
        commands = []
        for kind in ("chief", "worker"):
            tf_config = json.dumps({"cluster": cluster, "task": {"type": kind, "index": 0}})
            cmd = [*python(), CODELAB, "--data-dir", str(data), "--output-dir", out, "--epochs", str(epochs)]
            commands.append((cmd, clean_env({"TF_CONFIG": tf_config, "TF_USE_LEGACY_KERAS": "1"})))
        return timed(commands)


def through_entrypoint(data: Path, epochs: int) -> float:
    """``entrypoint local --workers 2`` running the same script unchanged."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [*python(), "-m", "entrypoint", "local", "--workers", "2", "--output-dir", out, "--", "run",
               "--framework", "tensorflow", "--script", CODELAB, "--", "--data-dir", str(data),
               "--output-dir", str(Path(out) / "codelab"), "--epochs", str(epochs)]
        return timed([(cmd, clean_env())])


def run(quick: bool) -> FamilyResult:
    """Both ways, interleaved; ``quick``: 60 images per class, one epoch, one round."""
    per_class, epochs, repeats, warmup = (60, 1, 1, 0) if quick else (400, 3, 3, 1)
    trained = int(per_class * 3 * 0.8) * epochs  # the codelab's 80/20 split, every epoch
    with tempfile.TemporaryDirectory() as tmp:
        data = image_folder(Path(tmp), per_class)
        variants = {"by hand (TF_CONFIG)": lambda: trained / by_hand(data, epochs),
                    "entrypoint local --workers 2": lambda: trained / through_entrypoint(data, epochs)}
        results = interleave(variants, repeats, warmup)
    result = FamilyResult("tensorflow", "TensorFlow MultiWorkerMirrored, 2 workers (images/s of wall time, "
                                        "higher is better)")
    result.rows = compare("2 workers", results, "images/s", "by hand (TF_CONFIG)", "x by hand")
    check(result.rows[1], ">=", 0.98)
    result.notes.append(f"tests/tensorflow/codelab_task.py unchanged: {per_class * 3} synthetic 32x32 images, "
                        f"{epochs} epoch(s), batch 8 per worker; {repeats} interleaved rounds after {warmup} warm-up")
    return result
