"""The example trainers: tabular reaches its stated accuracy; flowers loads its generated image folder; the digits
script trains with Keras 3 on one node and with tf-keras across two."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import PYTHON
from tests.tensorflow.runs import leftovers, local_command, run_args, run_job, summary, tail

pytestmark = pytest.mark.tensorflow
STATED_VAL_ACCURACY = 0.95  # trainers/tabular_keras.py's docstring


def test_tabular_keras_reaches_its_stated_accuracy(tmp_path: Path) -> None:
    job = tmp_path / "job"
    proc = run_job([PYTHON, "-m", "entrypoint", *run_args("--module", "trainers.tabular_keras", "--job-dir",
                                                          str(job))], tmp_path)
    assert proc.returncode == 0, tail(proc)
    history = summary(job / "model")["history"]
    assert len(history["val_accuracy"]) == 20
    assert history["val_accuracy"][-1] >= STATED_VAL_ACCURACY


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


def test_digits_keras_script_trains_with_keras_3_on_one_node(tmp_path: Path) -> None:
    job = tmp_path / "job"
    proc = run_job([PYTHON, "-m", "entrypoint", *run_args("--module", "trainers.digits_keras", "--job-dir", str(job),
                                                          "--", "--epochs", "5")], tmp_path)
    assert proc.returncode == 0, tail(proc)
    assert "keras 3." in proc.stdout and (job / "model" / "model.keras").is_file()
    assert float(proc.stdout.split("val_accuracy")[-1]) >= 0.9


@pytest.mark.slow
def test_digits_keras_script_trains_with_tf_keras_on_two_replicas(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_job(local_command(out, "--workers", "2", run=run_args("--module", "trainers.digits_keras", "--",
                                                                     "--tf-keras", "--epochs", "5")), tmp_path)
    assert proc.returncode == 0, tail(proc)
    assert proc.stdout.count("tf_keras 2.") == 2 and (out / "model" / "model.keras").is_file()
    assert leftovers(tmp_path) == []
