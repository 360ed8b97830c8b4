"""``run`` with TensorFlow: set TF_CONFIG and TF_USE_LEGACY_KERAS, then run hooks, a script, a server or an evaluator.

Nothing here imports TensorFlow at module level: the environment must be complete before the first
``import tensorflow`` (TF reads TF_USE_LEGACY_KERAS once, at import).
"""

from __future__ import annotations

import logging
import os
import traceback

from entrypoint.environments import read_settings
from entrypoint.errors import ExitCode, RetryableError, TrainerError
from entrypoint.options import RunOptions
from entrypoint.plan import Plan
from entrypoint.progress import setup_logging
from entrypoint.usercode import is_hooks_module, load_hooks, require_code

log = logging.getLogger("entrypoint.tensorflow")
# TensorFlow errors that mean a peer went missing or a collective timed out: retry the job.
_RETRYABLE_TF_ERRORS = ("DeadlineExceededError", "UnavailableError", "AbortedError")


def prepare_environment(plan: Plan) -> dict[str, str]:
    """Export TF_CONFIG (``chief``, never ``master``), AIP_* dirs and TF_USE_LEGACY_KERAS before TF loads."""
    env = plan.emitted_env()  # includes TF_USE_LEGACY_KERAS=1 unless the user chose otherwise
    os.environ.update(env)
    return env


def retryable(exc: BaseException) -> bool:
    """Whether ``exc`` is a TensorFlow error caused by a missing peer or a timeout (without importing TF)."""
    cls = type(exc)
    return cls.__module__.startswith("tensorflow") and cls.__name__ in _RETRYABLE_TF_ERRORS


def _dispatch(plan: Plan, options: RunOptions) -> int:
    kind, target = require_code(options, read_settings().module)
    if kind == "script" or not is_hooks_module(target):
        from entrypoint.tensorflow.script import run_script

        return run_script(kind, target, options.user_args)
    role = plan.topology.role
    if role == "ps" or (role == "worker" and plan.strategy == "ParameterServerStrategy"):
        from entrypoint.tensorflow.servers import serve

        return serve(plan, options)
    module = load_hooks(target)
    if role == "evaluator":
        from entrypoint.tensorflow.evaluator import evaluate_forever

        return evaluate_forever(plan, options, module)
    from entrypoint.tensorflow.trainer import train

    return train(plan, options, module)


def launch(plan: Plan, options: RunOptions) -> int:
    """Run this replica's part of a TensorFlow job and return its exit code."""
    topo = plan.topology
    setup_logging(f"[{topo.role}{topo.index}] " if topo.distributed else "")
    prepare_environment(plan)
    log.info("tensorflow: role %s index %d, strategy %s (%s)", topo.role, topo.index, plan.strategy, plan.reason)
    try:
        return _dispatch(plan, options)
    except (TrainerError, KeyboardInterrupt):
        raise
    except Exception as exc:  # the user's code or TensorFlow failed: one exit code, here
        traceback.print_exc()
        if retryable(exc):
            raise RetryableError(f"a peer is missing or timed out: {type(exc).__name__}") from exc
        return ExitCode.USER_CODE
