"""``run`` with TensorFlow, in this process: hooks on chief and workers, a server, an evaluator, or a script.

Nothing here imports TensorFlow at module level: the runner has already exported TF_CONFIG (``chief``,
never ``master``), TF_USE_LEGACY_KERAS and TF_CPP_MIN_LOG_LEVEL, which TensorFlow reads once, at import.
"""

from __future__ import annotations

import logging

from entrypoint.errors import ExitCode
from entrypoint.failures import FailureContext
from entrypoint.lifecycle.runner import run_process
from entrypoint.planning.plan import Plan
from entrypoint.planning.usercode import load_hooks, run_script
from entrypoint.tensorflow.keras3 import guard_script, spans_workers
from entrypoint.tensorflow.leave import leave_together
from entrypoint.tensorflow.stopping import TrainingStop

log = logging.getLogger("entrypoint.tensorflow")


def launch(plan: Plan, ctx: FailureContext) -> int:
    """Run this replica's part of a TensorFlow job and return its exit code (replicas that succeeded leave together).

    TensorFlow drives every GPU of the node from one process: this one, placed as the node's only process.
    """
    code = run_process(plan.only_process(), ctx)
    if code == ExitCode.OK:
        leave_together(plan)
    return code


def run(plan: Plan, ctx: FailureContext) -> int:
    """The replica's one process: a script, a server, an evaluator, or the hooks under the plan's strategy."""
    topo, code = plan.topology, plan.require_code()
    log.info("tensorflow: role %s index %d, strategy %s (%s)", topo.role, topo.index, plan.strategy, plan.reason)
    if code.kind != "hooks":
        if spans_workers(plan):  # Keras 3 on one node trains; across workers its fit fails: refuse it at once
            guard_script("--script" if code.kind == "script" else "--module")
        return run_script(code, plan.options.user_args)
    if topo.role == "ps" or (topo.role == "worker" and plan.strategy == "ParameterServerStrategy"):
        from entrypoint.tensorflow.servers import serve

        return serve(plan)
    if topo.role == "evaluator":
        from entrypoint.tensorflow.evaluator import evaluate_forever

        return evaluate_forever(plan, load_hooks(code.target))
    if plan.strategy == "ParameterServerStrategy":  # its chief stops at once, once its strategy exists
        from entrypoint.tensorflow.trainer import train

        return train(plan, load_hooks(code.target), ctx)
    with TrainingStop().installed() as stop:  # before the module (and TensorFlow) loads: a stop there is named
        module = load_hooks(code.target)
        from entrypoint.tensorflow.trainer import train

        return train(plan, module, ctx, stop)
