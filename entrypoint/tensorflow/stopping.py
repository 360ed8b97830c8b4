"""A TensorFlow hooks job's stop signals, phase by phase (no TensorFlow import here: it is installed before it).

SIGTERM and SIGINT reach the chief or a worker of a hooks job in one of three kinds of phase:

- **Nothing trained yet in this attempt** (loading the module and TensorFlow, the strategy, building the model and
  the datasets, the restore, Keras' restore of its backup, validating again the epoch a stop abandoned): there is
  nothing to commit, so the handler ends the process at once (``StopRequested`` raised where the main thread
  stands), ``preempted``, its message saying that nothing was trained, so nothing committed, and where the restart
  resumes.
- **Training** (from the first training step to the end of ``fit``): the handler only sets the flag; the loop's next
  agreed point (``agreement.py``: a training batch, a validation batch or an epoch end) commits the newest trained step
  on every worker and stops (``preemption.py``), so a validation pass is abandoned at its next batch.
- **After training** (the export, the summary), with one worker: the final step is committed already (the last epoch
  end), so the handler ends at once, ``preempted``, and the restart exports. Under MultiWorkerMirroredStrategy the
  export runs collectives on every worker, so a signal there only sets the flag: the export finishes (or the
  platform's kill ends it), and the restart finds the final checkpoint and exports.

A stop the loop cannot take within ``--grace-period`` (a training step or a validation batch longer than that, the
export under MultiWorkerMirroredStrategy) ends the process at the grace period's end, less a margin for its record
(``guard``): class ``preempted_uncommitted`` when steps it trained are not committed, its last line saying so, where
the platform's SIGKILL would say nothing. The main thread blocked in TensorFlow's native code runs no Python signal
handler until it returns, so the guard's clock starts when the signal arrives (``signals.watch_arrivals``).

TensorFlow's cluster start (MultiWorkerMirroredStrategy's constructor) installs its own SIGTERM handler:
``reinstall`` (``StopRequest``'s) takes it back.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

from entrypoint import failures
from entrypoint.errors import StopRequested, signal_class
from entrypoint.lifecycle import shutdown, signals
from entrypoint.lifecycle.signals import StopRequest

NOTHING_YET = "the restart resumes from the job's newest committed checkpoint (or starts anew without one)"
MARGIN = 2.0  # seconds the guard keeps of the grace period (a fifth of it at most) to write its record and end


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
        # what a stop still under way at the grace period's end had committed (``guard``)
        self.late, self.late_committed = "the steps since the newest checkpoint could not be committed", False
        self.arrived = (0, 0.0)  # the first stop signal and when it arrived (``signals.watch_arrivals``)
        self.ending = threading.Event()  # the stop is taken: its record is being written
        self._signalled = threading.Event()  # set on a stop signal's arrival
        self._guarded = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[TrainingStop]:
        """Within the block, SIGTERM and SIGINT are this stop's; the previous handlers come back after it."""
        self.phase = "loading the hooks module (and TensorFlow)"
        self.install()
        try:
            yield self
        finally:
            self.uninstall()

    def guard(self, grace: float, ctx: failures.FailureContext, where: Callable[[], str]) -> None:
        """From now on (main thread), a stop not taken by ``grace`` seconds after its signal, less ``MARGIN``, ends
        the process then: class ``preempted_uncommitted`` (``preempted`` when ``late_committed``), its message naming
        ``late`` and ``where()`` the replica stood."""
        if grace > 0 and not self._guarded:
            self._guarded = True
            signals.watch_arrivals(self._arrived)
            threading.Thread(target=self._keep, args=(grace, ctx, where), name="grace-period", daemon=True).start()

    def _arrived(self, signum: int) -> None:
        """A stop signal arrived (the arrivals' thread: the main thread may not run its handler for a while)."""
        if not self._signalled.is_set():
            self.arrived = (signum, time.monotonic())
            self._signalled.set()

    def _keep(self, grace: float, ctx: failures.FailureContext, where: Callable[[], str]) -> None:
        self._signalled.wait()
        signum, at = self.arrived
        if self.ending.wait(max(grace - min(MARGIN, grace / 5) - (time.monotonic() - at), 0.0)):
            return
        failure = failures.Failure(signal_class(signum, self.late_committed),
                                   f"stopped by {signal_name(signum)}: {self.late} within --grace-period {grace:g} s: "
                                   f"this replica was still {where()} when it ran out; {self.restart_late}")
        code = failures.finish(ctx, failures.write_record(ctx, failure))
        shutdown.now(code)

    @property
    def restart_late(self) -> str:
        """Where the restart of a stop the grace period cut short resumes."""
        if self.late_committed:
            return "the restart resumes there"
        return "the restart resumes from the job's newest committed checkpoint (or starts anew without one)"

    def nothing_committed(self, signum: int) -> StopRequested:
        """The stop of a phase before this attempt trained a step."""
        return StopRequested(signum, f"stopped by {signal_name(signum)} while {self.phase}: nothing trained in this "
                             f"attempt, so nothing to commit; {self.restart}")

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum:  # a second signal: already stopping (or committing)
            sys.stderr.write(f"entrypoint: received {signal_name(signum)} again: already stopping\n")
            return
        self.signum, self.received_at = signum, time.monotonic()
        self._arrived(signum)
        name = signal_name(signum)
        # Written straight to the stream: logging from a signal handler can deadlock on its lock.
        if self.interrupt is not None:
            sys.stderr.write(f"entrypoint: received {name} while {self.phase}: stopping now\n")
            raise self.interrupt(signum)
        sys.stderr.write(f"entrypoint: received {name}: every worker commits the newest trained step at the next "
                         "training or validation batch, then stops\n")
