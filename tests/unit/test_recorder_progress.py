"""The chief's recorder feeds Kubeflow Trainer's progress (docs/goodput.md): at every progress record the newest
step, the total and the metrics; at the end of a finished training, done, then the poster is closed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from entrypoint.lifecycle import recorder
from entrypoint.outputs.goodput.ledger import Ledger


class Poster:
    """Takes what the recorder hands Kubeflow's poster (``KubeflowProgress``'s two methods)."""

    def __init__(self) -> None:
        self.updates: list[tuple[int, int | None, dict[str, float], bool]] = []
        self.closed: float | None = None

    def update(self, step: int, total: int | None, metrics: dict[str, float], done: bool = False) -> None:
        self.updates.append((step, total, dict(metrics), done))

    def close(self, timeout: float) -> bool:
        self.closed = timeout
        return True


def test_progress_reaches_the_poster_at_each_record_and_done_at_the_end(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorder, "FLUSH_EVERY", 0.0)
    poster: Any = Poster()
    record = recorder.Recorder(Ledger(str(tmp_path), "workerpool0-0@h:1:0", "workerpool0-0", 0), poster)
    record.total = 4
    record.enter("preparation")
    for step in (1, 2):
        record.step_begin()
        record.step_end(step)
    record.metrics = {"accuracy": 0.5}
    for step in (3, 4):
        record.step_begin()
        record.step_end(step)
    record.close("finished")
    assert poster.updates == [(1, 4, {}, False), (2, 4, {}, False), (3, 4, {"accuracy": 0.5}, False),
                              (4, 4, {"accuracy": 0.5}, False), (4, 4, {"accuracy": 0.5}, True)]
    assert poster.closed == recorder.PROGRESS_CLOSE


def test_a_failed_training_is_not_reported_done(tmp_path: Path) -> None:
    poster: Any = Poster()
    record = recorder.Recorder(Ledger(str(tmp_path), "workerpool0-0@h:1:0", "workerpool0-0", 0), poster)
    record.step_begin()
    record.step_end(1)
    record.close("failed")
    assert [u[3] for u in poster.updates] == [False] and poster.closed is not None
