"""Exercise the private tf-keras names the preemption callbacks rely on; print what happened as JSON.

Run in its own process by test_preemption.py (TF_USE_LEGACY_KERAS must be set before TensorFlow loads):
``python tests/tensorflow/preemption_probe.py DIR``. One worker: a stop is acted on at the batch it is heard at.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import tensorflow as tf

from entrypoint.errors import StopRequested
from entrypoint.outputs.checkpoints import Retention, committed, read_marker
from entrypoint.tensorflow.callbacks import CommitCheckpoints
from entrypoint.tensorflow.checkpoint_io import KerasCheckpointIO
from entrypoint.tensorflow.preemption import AgreedStops, SaveBeforePreemption
from entrypoint.tensorflow.stopping import TrainingStop
from tests.tensorflow.slow_hooks import build_datasets
from tests.tensorflow.toy_hooks import build_model

STATE_NAMES = ("_enable_save_before_preemption", "_ckpt_saved_batch", "_ckpt_saved_epoch", "back_up",
               "maybe_load_initial_counters_from_ckpt", "write_checkpoint_manager", "read_checkpoint_manager")
CALLBACK_NAMES = ("_current_epoch", "_batches_count", "_training_state")
EPOCHS, STEPS_PER_EPOCH, SIGNAL_AT = 3, 32, 5


class Observe(tf.keras.callbacks.Callback):
    """Placed after the preemption callback: the restored step, the private names, and a signal at a batch."""

    def __init__(self, saver: SaveBeforePreemption, stop: TrainingStop | None) -> None:
        super().__init__()
        self.saver, self.stop = saver, stop
        self.start_step = -1
        self.names: dict[str, bool] = {}

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.start_step = int(self.model.optimizer.iterations.numpy())
        state = self.saver._training_state
        self.names = {name: hasattr(state, name) for name in STATE_NAMES}
        self.names.update({f"BackupAndRestore.{name}": hasattr(self.saver, name) for name in CALLBACK_NAMES})
        # every backup write goes through it (our override mirrors the chief's copy to a bucket)
        self.names["BackupAndRestore._backup"] = callable(getattr(tf.keras.callbacks.BackupAndRestore, "_backup", None))
        self.names["Model.get_metrics_result"] = callable(getattr(self.model, "get_metrics_result", None))

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.stop is not None and batch == SIGNAL_AT and not self.stop.signum:
            self.stop.signum, self.stop.received_at = signal.SIGTERM, time.monotonic()  # as the handler would


def fit(root: Path, stop: TrainingStop | None) -> tuple[Observe, Any, BaseException | None]:
    """One fit of the slow toy under the default strategy with our callbacks."""
    tf.keras.utils.set_random_seed(1)
    args = argparse.Namespace(samples=512, pause=0.004)
    train = build_datasets(args, None)[0].batch(16)
    model = build_model(args, None)
    commit = CommitCheckpoints(KerasCheckpointIO(root / "checkpoints", True, Retention(3)), "default")
    saver = SaveBeforePreemption(str(root / "checkpoints" / "backup"), "epoch", commit)
    observe = Observe(saver, stop)
    stops = AgreedStops(saver, stop or TrainingStop(), "node-0", 0, 1, 60.0)
    try:
        model.fit(train, epochs=EPOCHS, callbacks=[saver, observe, commit, stops], verbose=0)
    except StopRequested as exc:
        return observe, model, exc
    return observe, model, None


def main(root: Path) -> dict[str, Any]:
    """Stop a fit at a batch, resume it; what each step saw."""
    observe, model, stopped = fit(root, TrainingStop())
    newest_step, newest = committed(root / "checkpoints")[-1]
    marker = read_marker(newest)
    resumed, model2, again = fit(root, None)
    return {
        "names": observe.names, "stop_code": stopped.exit_code if isinstance(stopped, StopRequested) else None,
        "stop_class": stopped.failure.name if isinstance(stopped, StopRequested) else None,
        "stop_message": str(stopped), "stopped_step": int(model.optimizer.iterations.numpy()),
        "newest_committed": newest_step, "marker": marker, "resumed_at": resumed.start_step,
        "final_step": int(model2.optimizer.iterations.numpy()), "second_fit_error": repr(again) if again else None,
        "expected_steps": EPOCHS * STEPS_PER_EPOCH,
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1])), default=str))
