"""One PyTorch training process: join the process group and run the hooks loop, or run the user's script.

Runs in the node's own process (one process per node) or in ``python -m entrypoint.worker`` started
by torch's elastic agent; either way it receives its plan already placed at its rank.
"""

from __future__ import annotations

import os
from datetime import timedelta

from entrypoint.cluster import envvars as ev
from entrypoint.failures import FailureContext
from entrypoint.lifecycle.signals import stop_at_once
from entrypoint.planning.plan import Plan
from entrypoint.planning.usercode import run_script

STARTING = "starting the training process: nothing trained in this attempt, so nothing to commit"


def run(plan: Plan, failure_context: FailureContext) -> int:
    """This process's part of the job; its exit code (a script's own, or 0 after the loop)."""
    code, placed = plan.require_code(), plan.placed
    if not plan.topology.processes_started_externally:
        # torch's agent counts only its own restarts of the workers (never: max_restarts is 0); the count
        # users read is how often the platform restarted this replica, which only the plan knows.
        os.environ[ev.TORCHELASTIC_RESTART_COUNT] = str(plan.restart_count)
    if code.kind != "hooks":
        return run_script(code, plan.options.user_args)  # it joins its own process group (env://)
    with stop_at_once(STARTING):  # from here to the hooks loop's guard (``Trainer.fit``) a stop ends it at once
        import torch
        import torch.distributed as dist

        from entrypoint.pytorch.launch import membership
        from entrypoint.pytorch.launch.collectives import TorchDistributed
        from entrypoint.pytorch.loop.trainer import Trainer

        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(placed.local_rank)
        backend = "nccl" if cuda else "gloo"
        members = membership.for_plan(plan)  # survivors keep training: the loop forms (and re-forms) the group
        if members is None and plan.world_size > 1:
            dist.init_process_group(backend, timeout=timedelta(seconds=plan.options.timeout),
                                    device_id=torch.device("cuda", placed.local_rank) if cuda else None)
        comm = TorchDistributed(backend, placed.training_rank, placed.world_size, plan.options.timeout)
        trainer = Trainer(plan, comm, failure_context, members)
    try:
        trainer.fit()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0
