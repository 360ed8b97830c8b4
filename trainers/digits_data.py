"""scikit-learn's bundled digits, read without importing scikit-learn (the digits examples' data, every framework's).

``load_digits()`` returns what ``sklearn.datasets.load_digits(return_X_y=True)`` returns (1797 rows of 64 pixels
valued 0-16, and their labels), read with NumPy from the file scikit-learn ships: importing scikit-learn imports
SciPy, about 0.7 s of CPU in every process of every replica, on every start and restart. Where scikit-learn keeps the
file elsewhere, its own loader reads it. Imports no ML framework.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

__all__ = ["load_digits"]


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The digits' pixels (float64, 1797 x 64) and labels (int), as scikit-learn's loader returns them."""
    spec = importlib.util.find_spec("sklearn")
    folders = spec.submodule_search_locations if spec is not None else None
    shipped = [Path(p) / "datasets" / "data" / "digits.csv.gz" for p in folders or []]
    if not shipped or not shipped[0].is_file():  # another layout: scikit-learn's own loader
        from sklearn.datasets import load_digits as sklearn_digits

        pixels, labels = sklearn_digits(return_X_y=True)
        return pixels, labels
    table = np.loadtxt(shipped[0], delimiter=",")
    return table[:, :-1], table[:, -1].astype(int)
