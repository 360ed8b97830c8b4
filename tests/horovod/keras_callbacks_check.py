"""What tests/horovod/hvd_keras_callbacks.py wrote, checked: shared by the venv and the container tests (no
Horovod import here, so the container tests can use it from the PyTorch venv)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

SCRIPT = "tests/horovod/hvd_keras_callbacks.py"


def check_callbacks(result: dict[str, Any], out: Path) -> None:
    """What the example wrote proves each callback did its work (shared with the container test)."""
    ranks, lr = result["ranks"], result["scaled_lr"]
    assert result["size"] == 2 and [r["rank"] for r in ranks] == [0, 1]
    assert result["keras"].startswith("tf_keras")
    # BroadcastGlobalVariablesCallback: different initial weights, the same weights at the end
    assert ranks[0]["weights_sum"] == ranks[1]["weights_sum"]
    # MetricAverageCallback: each rank trains on its own data, yet both log the same (averaged) metrics
    assert ranks[0]["history"]["loss"] == ranks[1]["history"]["loss"]
    assert ranks[0]["history"]["accuracy"] == ranks[1]["history"]["accuracy"]
    # LearningRateWarmupCallback: from lr / size up to lr over epochs 0-1; LearningRateScheduleCallback: lr
    # for epochs 2-3, then tenfold less per epoch from epoch 3 (lr * 0.1 ** (epoch - 3)). SGD with momentum:
    # Horovod's momentum correction is skipped with a warning (tf-keras keeps momentum as a constant)
    for seen in ranks:
        rates = seen["rates"]
        assert len(rates) == 5
        assert lr / 2 < rates[0] < lr
        assert rates[1:] == pytest.approx([lr, lr, lr, lr / 10])
    # hvd.allreduce of horovod.tensorflow.keras, as examples average their own metrics: the mean of the ranks
    assert {r["mean_rank"] for r in ranks} == {0.5}
    assert sorted(p.name for p in out.glob("checkpoint-*.h5")) == [f"checkpoint-{e}.h5" for e in range(1, 6)]
