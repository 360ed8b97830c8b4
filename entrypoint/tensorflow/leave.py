"""MultiWorkerMirrored replicas leave together: an exit barrier on TensorFlow's own coordination service.

The chief hosts the coordination service and every replica sends it heartbeats. A replica that is done
exits and stops sending them; a chief still working some ten seconds later (its export, a script's own
saving) then logs ``BaseCollectiveExecutor::StartAbort UNAVAILABLE ... The tasks have crashed`` although
the job succeeded. So a training replica whose part succeeded waits for every other at a barrier; the
workers then say they leave, and the chief, whose service they talk to, leaves last.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from entrypoint.planning.plan import Plan

log = logging.getLogger("entrypoint.tensorflow")
BARRIER = "trainer-exit"


def coordination() -> Any:
    """TensorFlow's eager context when this process joined a coordination service, else None."""
    if "tensorflow" not in sys.modules:  # a script that never imported TensorFlow
        return None
    from tensorflow.python.eager import context  # the service's barrier and key-value store (no public API)

    ctx = context.context()
    config = ctx.coordination_service
    return ctx if config is not None and config.service_type else None


def leave_together(plan: Plan) -> None:
    """The exit barrier of a MultiWorkerMirrored replica whose part succeeded (a no-op for any other)."""
    topo = plan.topology
    if plan.strategy != "MultiWorkerMirroredStrategy" or topo.role not in ("chief", "worker"):
        return
    ctx = coordination()
    if ctx is None:
        return
    timeout_ms = int(plan.options.timeout * 1000)
    try:
        ctx.wait_at_barrier(BARRIER, timeout_ms)
        if topo.role != "chief":
            ctx.set_config_key_value(f"{BARRIER}/left/worker/{topo.index}", "1")
            return
        for index in range(len(topo.workers)):  # their last word to the chief's service: it may go now
            ctx.get_config_key_value(f"{BARRIER}/left/worker/{index}", timeout_ms)
    except Exception as exc:  # TensorFlow's errors: this replica succeeded, whatever its peers do
        first = " ".join(str(exc).split())[:200]
        log.warning("%s: the other replicas did not all finish within --timeout %g s; leaving without them (this "
                    "replica succeeded): %s", topo.replica_name, plan.options.timeout, first)
