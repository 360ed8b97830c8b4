"""Exercise the private tf-keras / TensorFlow names the preemption callback relies on; print what happened as JSON.

Run in its own process by test_preemption.py (TF_USE_LEGACY_KERAS must be set before TensorFlow loads):
``python tests/tensorflow/preemption_probe.py DIR``.
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
from tensorflow.python.distribute.failure_handling import failure_handling_util as util

from entrypoint.errors import StopRequested
from entrypoint.lifecycle.signals import StopRequest
from entrypoint.outputs.checkpoints import Retention, committed, read_marker
from entrypoint.tensorflow.callbacks import CommitCheckpoints
from entrypoint.tensorflow.checkpoint_io import KerasCheckpointIO
from entrypoint.tensorflow.preemption import SaveBeforePreemption, make_handler
from tests.tensorflow.slow_hooks import build_datasets
from tests.tensorflow.toy_hooks import build_model

STATE_NAMES = ("_enable_save_before_preemption", "preemption_handler", "_ckpt_saved_batch", "_ckpt_saved_epoch",
               "back_up", "backup_if_preempted", "write_checkpoint_manager", "read_checkpoint_manager")
HANDLER_NAMES = ("_run_counter", "_check_preemption_and_maybe_checkpoint", "_platform_device",
                 "_stop_poll_termination_signal_thread", "_stop_cluster_wise_termination_watcher_thread")
EPOCHS, STEPS_PER_EPOCH, SIGNAL_AT = 3, 32, 5


class Observe(tf.keras.callbacks.Callback):
    """Placed after the preemption callback: the restored step, the private names, and a signal at a batch."""

    def __init__(self, saver: SaveBeforePreemption, request: StopRequest | None) -> None:
        super().__init__()
        self.saver, self.request = saver, request
        self.start_step = -1
        self.names: dict[str, bool] = {}

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.start_step = int(self.model.optimizer.iterations.numpy())
        state, handler = self.saver._training_state, self.saver.handler
        self.names = {name: hasattr(state, name) for name in STATE_NAMES}
        self.names.update({f"handler.{name}": hasattr(handler, name) for name in HANDLER_NAMES})
        self.names["BackupAndRestore._current_epoch"] = hasattr(self.saver, "_current_epoch")
        # every backup write goes through it (our override mirrors the chief's copy to a bucket)
        self.names["BackupAndRestore._backup"] = callable(getattr(tf.keras.callbacks.BackupAndRestore, "_backup", None))

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.request is not None and batch == SIGNAL_AT and not self.request.signum:
            self.request.signum, self.request.received_at = signal.SIGTERM, time.monotonic()  # as the handler would


def fit(root: Path, request: StopRequest | None) -> tuple[Observe, Any, BaseException | None]:
    """One fit of the slow toy under the default strategy with our callbacks."""
    tf.keras.utils.set_random_seed(1)
    args = argparse.Namespace(samples=512, pause=0.004)
    train = build_datasets(args, None)[0].batch(16)
    model = build_model(args, None)
    commit = CommitCheckpoints(KerasCheckpointIO(root / "checkpoints", True, Retention(3)), "default")
    saver = SaveBeforePreemption(str(root / "checkpoints" / "backup"), "epoch", request or StopRequest(), commit)
    observe = Observe(saver, request)
    try:
        model.fit(train, epochs=EPOCHS, callbacks=[saver, observe, commit], verbose=0)
    except StopRequested as exc:
        return observe, model, exc
    return observe, model, None


def main(root: Path) -> dict[str, Any]:
    """Pin the platform, stop a fit at an agreed step, resume it; what each step saw."""
    util.detect_platform = lambda: util.PlatformDevice.GCE_CPU  # where TensorFlow's own handler does nothing
    handler = make_handler(tf.distribute.get_strategy(), lambda: False, lambda: None, lambda: None, str(root / "x"))
    pinned = handler._platform_device.name
    handler._stop_poll_termination_signal_thread()
    observe, model, stopped = fit(root, StopRequest())
    newest_step, newest = committed(root / "checkpoints")[-1]
    marker = read_marker(newest)
    resumed, model2, again = fit(root, None)
    return {
        "pinned_platform": pinned, "detect_platform_restored": util.detect_platform() == util.PlatformDevice.GCE_CPU,
        "names": observe.names, "stop_code": stopped.exit_code if isinstance(stopped, StopRequested) else None,
        "stop_message": str(stopped), "stopped_step": int(model.optimizer.iterations.numpy()),
        "newest_committed": newest_step, "marker": marker, "resumed_at": resumed.start_step,
        "final_step": int(model2.optimizer.iterations.numpy()), "second_fit_error": repr(again) if again else None,
        "expected_steps": EPOCHS * STEPS_PER_EPOCH,
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1])), default=str))
