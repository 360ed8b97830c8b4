"""A Keras checkpoint written again at its step (a rerun reaching it, a notice's save then the epoch's end) is
written beside the committed one and swapped in (``checkpoints.write_beside``): a rewrite that fails midway leaves
the committed checkpoint of that step loadable, with its own weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from entrypoint.outputs import checkpoints
from tests.conftest import skip_unless_installed

skip_unless_installed("tensorflow", "tf_keras")  # the images' tf.keras (TF_USE_LEGACY_KERAS=1)
pytestmark = pytest.mark.tensorflow


def model(seed: int) -> Any:
    import tf_keras as keras  # the images' tf.keras (TF_USE_LEGACY_KERAS=1)

    keras.utils.set_random_seed(seed)
    built = keras.Sequential([keras.layers.Dense(3, input_shape=(4,)), keras.layers.Dense(2)])
    built.compile(optimizer="adam", loss="mse")
    return built


class FailingMidway:
    """A model whose weights are written whole, after which the disk fills (the marker is never written)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def save_weights(self, path: str) -> None:
        self.inner.save_weights(path)
        raise OSError(28, "No space left on device", path)


def test_a_rewrite_of_a_committed_step_that_fails_midway_leaves_it_loadable(tmp_path: Path) -> None:
    from entrypoint.tensorflow.checkpoint_io import KerasCheckpointIO

    io = KerasCheckpointIO(tmp_path, True, checkpoints.Retention(3))
    path = checkpoints.checkpoint_path(tmp_path, 3)
    first = model(1)
    io.save(path, first, {"step": 3, "epoch": 1})
    with pytest.raises(OSError, match="No space left"):
        io.save(path, FailingMidway(model(2)), {"step": 3, "epoch": 1})
    assert checkpoints.committed(tmp_path) == [(3, path)]
    checkpoints.verify(path)
    restored = model(3)
    assert io.load(path, restored) == 1
    for mine, theirs in zip(first.weights, restored.weights, strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    io.save(path, model(4), {"step": 3, "epoch": 1})  # a rewrite that succeeds replaces it, nothing left beside
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000003"]
