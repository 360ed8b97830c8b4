"""Progress lines shared by every framework's loop: step, loss, samples/s, ETA (printed by the chief)."""

from __future__ import annotations

import logging
import time

from entrypoint.outputs import logs

log = logging.getLogger("entrypoint")


def setup_logging(prefix: str = "", fmt: str | None = None, trial: str | None = None) -> None:
    """The --log-format of our lines and the root logger's, once; ``None``: the parent's (docs/operations.md)."""
    logs.setup(fmt, prefix, trial)


def _eta(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """Throughput and ETA over a window of steps; ``line()`` formats one progress line."""

    def __init__(self, total_steps: int, global_batch_size: int, start_step: int = 0) -> None:
        self.total_steps = total_steps
        self.global_batch_size = global_batch_size
        self._window_start = time.perf_counter()
        self._window_step = start_step

    def line(self, epoch: int, epochs: int, step: int, loss: float) -> str:
        """``epoch e/E step s/S loss l samples/s r eta h:mm:ss``; resets the throughput window."""
        now = time.perf_counter()
        steps = max(step - self._window_step, 1)
        elapsed = max(now - self._window_start, 1e-9)
        rate = steps * self.global_batch_size / elapsed
        remaining = (self.total_steps - step) * elapsed / steps
        self._window_start, self._window_step = now, step
        logs.note_step(step)
        return (f"epoch {epoch}/{epochs} step {step}/{self.total_steps} loss {loss:.4f} "
                f"samples/s {rate:.1f} eta {_eta(remaining)}")
