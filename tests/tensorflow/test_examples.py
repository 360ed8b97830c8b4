"""The example trainers: flowers loads its generated image folder on one node. The README's TensorFlow quick start,
which tests/readme/test_readme.py runs, trains the others: tabular to its stated accuracy, the digits script with
Keras 3 on one node and with tf-keras across two (its RESULTS check each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import PYTHON
from tests.tensorflow.runs import run_args, run_job, summary, tail

pytestmark = pytest.mark.tensorflow


def test_flowers_keras_trains_on_a_generated_image_folder(tmp_path: Path) -> None:
    job, scratch = tmp_path / "job", tmp_path / "scratch"
    scratch.mkdir()
    command = [PYTHON, "-m", "entrypoint", *run_args("--module", "trainers.flowers_keras", "--job-dir", str(job),
                                                     "--epochs", "2", "--", "--image-size", "32",
                                                     "--images-per-class", "12")]
    proc = run_job(command, tmp_path, env={"TMPDIR": str(scratch)})
    assert proc.returncode == 0, tail(proc)
    generated = scratch / "flowers_keras_generated_12"
    assert sorted(p.name for p in generated.iterdir() if p.is_dir()) == ["class_0", "class_1", "class_2"]
    assert len(list(generated.glob("class_*/*.png"))) == 36
    result = summary(job / "model")
    assert result["final_step"] == 2 * 2  # 29 training images (80%) / batch 16 = 2 steps per epoch
    assert (job / "model" / "saved_model.pb").is_file()
