"""The TensorFlow loop beats the hang watchdog through a validation pass and at its end: what Keras does between the
pass's last batch and the epoch's checkpoints is not timed as a hang (a loaded machine once took 5 s there)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import skip_unless_installed

skip_unless_installed("tensorflow")
pytestmark = [pytest.mark.tensorflow]


class Beats:
    """The hang watchdog's side ProgressAndSteps uses, recording each phase it is told."""

    def __init__(self) -> None:
        self.step, self.phases, self.allowances = 0, [], {}  # type: ignore[var-annotated]

    def start(self) -> Beats:
        return self

    def beat(self, step: int, phase: str = "training", allowance: tuple[float, str] = (0.0, "")) -> None:
        self.step = step
        self.phases.append(phase)
        if allowance[0]:
            self.allowances[phase] = allowance

    def trained(self, step: int, phase: str = "training") -> None:
        self.beat(step, phase)

    def stop(self) -> None:
        self.phases.append("stopped")


def test_the_end_of_a_validation_pass_beats_before_the_epochs_checkpoints() -> None:
    import numpy as np
    import tensorflow as tf

    from entrypoint.tensorflow.callbacks import ProgressAndSteps

    beats = Beats()
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    data = np.ones((8, 4), "float32"), np.ones((8, 1), "float32")
    progress: Any = ProgressAndSteps(1, 4, 1, 100, False, beats)  # type: ignore[arg-type]
    model.fit(*data, batch_size=4, epochs=1, validation_data=data, callbacks=[progress], verbose=0)
    validating = [i for i, phase in enumerate(beats.phases) if phase.startswith("between steps (validating:")]
    assert len(validating) == 2, beats.phases
    after = beats.phases[validating[-1] + 1:]
    assert after[:2] == ["between steps (validation done; the epoch's checkpoints next)",
                         "checkpointing at the end of an epoch"], beats.phases
    # only the pass's end has more than --hang-timeout: its iterator's teardown (tf.data's autotuning, 60 s at most)
    assert {phase: seconds for phase, (seconds, _) in beats.allowances.items()} == {
        "between steps (validation done; the epoch's checkpoints next)": 60.0}
