"""The digits examples read scikit-learn's bundled file themselves (trainers/digits_data.py: importing scikit-learn
imports SciPy, 0.7 s of CPU in every process of every replica): what they read must be what scikit-learn's own loader
returns."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from tests.conftest import PYTHON, skip_unless_installed, subprocess_env

pytest.importorskip("torch")  # collected in every venv; these run where torch is
skip_unless_installed("sklearn")  # imported by the test that compares with it (1.1 s of CPU)
pytestmark = pytest.mark.pytorch


def test_the_digits_read_from_the_shipped_file_are_scikit_learns() -> None:
    from sklearn.datasets import load_digits

    from trainers.digits_data import load_digits as shipped

    pixels, labels = shipped()
    expected_pixels, expected_labels = load_digits(return_X_y=True)
    assert pixels.shape == (1797, 64) and pixels.dtype == expected_pixels.dtype
    assert np.array_equal(pixels, expected_pixels) and np.array_equal(labels, expected_labels)


def test_building_the_digits_datasets_does_not_import_scikit_learn() -> None:
    code = ("import argparse, sys; from trainers import digits_torch; "
            "train, val = digits_torch.build_datasets(argparse.Namespace(val_fraction=0.2), None); "
            "print(len(train), len(val), 'sklearn' in sys.modules, 'scipy' in sys.modules)")
    out = subprocess.run([PYTHON, "-c", code], env=subprocess_env(), capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["1437", "360", "False", "False"]
