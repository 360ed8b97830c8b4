"""A TensorFlow hooks job's stop signals, phase by phase (no TensorFlow import here: it is installed before it).

SIGTERM and SIGINT reach the chief or a worker of a hooks job in one of three kinds of phase:

- **Nothing trained yet in this attempt** (loading the module and TensorFlow, the strategy, building the model and
  the datasets, the restore, Keras' restore of its backup): there is nothing to commit, so the handler ends the
  process at once (``StopRequested`` raised where the main thread stands) with a record of class ``signal`` that
  says nothing could be committed and where the restart resumes. Never ``preempted``: no step is claimed.
- **Training** (from the first training step to the end of ``fit``): the handler only sets the flag; the loop's next
  agreed point (``agreement.py``: a training batch, a validation batch or an epoch end) commits the newest trained step
  on every worker and stops (``preemption.py``), so a validation pass is abandoned at its next batch.
- **After training** (the export, the summary), with one worker: the final step is committed already (the last epoch
  end), so the handler ends at once, ``preempted``, and the restart exports. Under MultiWorkerMirroredStrategy the
  export runs collectives on every worker, so a signal there only sets the flag: the export finishes (or the
  platform's kill ends it), and the restart finds the final checkpoint and exports.

TensorFlow's cluster start (MultiWorkerMirroredStrategy's constructor) installs its own SIGTERM handler:
``reinstall`` (``StopRequest``'s) takes it back.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType

from entrypoint.errors import StopRequested
from entrypoint.lifecycle.signals import StopRequest

NOTHING_YET = "the restart resumes from the job's newest committed checkpoint (or starts anew without one)"


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class TrainingStop(StopRequest):
    """A hooks job's StopRequest: in a phase with nothing to commit (``interrupt`` set) the first signal raises what
    ``interrupt`` makes of it at once; otherwise it sets the flag the loop's agreed points read."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "starting"  # what the main thread is doing (the hang watchdog's words)
        self.restart = NOTHING_YET  # where a restart resumes while nothing was trained in this attempt
        self.interrupt: Callable[[int], StopRequested] | None = self.nothing_committed

    @contextlib.contextmanager
    def installed(self) -> Iterator[TrainingStop]:
        """Within the block, SIGTERM and SIGINT are this stop's; the previous handlers come back after it."""
        self.phase = "loading the hooks module (and TensorFlow)"
        self.install()
        try:
            yield self
        finally:
            self.uninstall()

    def nothing_committed(self, signum: int) -> StopRequested:
        """The stop of a phase before this attempt trained a step."""
        return StopRequested(signum, f"stopped by {signal_name(signum)} while {self.phase}, before this attempt "
                             f"trained a step: nothing could be committed; {self.restart}", committed=False)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum:  # a second signal: already stopping (or committing)
            sys.stderr.write(f"entrypoint: received {signal_name(signum)} again: already stopping\n")
            return
        self.signum, self.received_at = signum, time.monotonic()
        name = signal_name(signum)
        # Written straight to the stream: logging from a signal handler can deadlock on its lock.
        if self.interrupt is not None:
            sys.stderr.write(f"entrypoint: received {name} while {self.phase}: stopping now\n")
            raise self.interrupt(signum)
        sys.stderr.write(f"entrypoint: received {name}: every worker commits the newest trained step at the next "
                         "training or validation batch, then stops\n")
