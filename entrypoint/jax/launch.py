"""``run`` with JAX, in this process: one process per node drives the node's devices, as JAX wants.

``launch`` runs the node's only process here (placed at local rank 0); ``run`` joins the job's processes
(``distributed.start``: one ``jax.distributed.initialize``), sets Keras' distribution, and runs the user's script
unchanged or the hooks loop. Nothing here imports JAX at module level.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from entrypoint.failures import FailureContext
from entrypoint.lifecycle.runner import run_process
from entrypoint.planning.plan import Plan
from entrypoint.planning.usercode import run_script

log = logging.getLogger("entrypoint.jax")


def launch(plan: Plan, ctx: FailureContext) -> int:
    """Run this node's one JAX process and return its exit code."""
    return run_process(plan.only_process(), ctx)


def run(plan: Plan, ctx: FailureContext) -> int:
    """The node's process: join the others, set Keras' distribution, then the script or the hooks loop."""
    from entrypoint.jax import distributed

    topo, code = plan.topology, plan.require_code()
    log.info("jax: %s, node %d of %d, strategy %s (%s)", topo.role, topo.node_rank or 0, topo.num_nodes,
             plan.strategy, plan.reason)
    if code.kind == "hooks":  # its guard answers a stop from before the distributed start on
        from entrypoint.jax.trainer import train

        return train(plan, code.target, ctx)
    found = distributed.start(plan)
    import keras

    from entrypoint.jax.data import share_arrays

    keras.utils.set_random_seed(plan.options.seed)  # the same initial weights and shuffles on every process
    distributed.set_distribution(plan, found)
    share_arrays(found.process_index, found.process_count)
    if found.process_count > 1:
        initialized_once(found)
    return run_script(code, plan.options.user_args)


def initialized_once(found: Any) -> None:
    """A script written for its own launcher initializes JAX's distributed runtime itself (Kubeflow's JAX examples,
    ``keras.distribution.initialize``): the entrypoint already did, so its call only says so."""
    import jax
    import keras

    def already(what: str, *_args: Any, **_kwargs: Any) -> None:
        log.info("%s: already done by the entrypoint (process %d of %d); the script's call changes nothing", what,
                 found.process_index, found.process_count)

    jax.distributed.initialize = functools.partial(already, "jax.distributed.initialize")
    keras.distribution.initialize = functools.partial(already, "keras.distribution.initialize")
