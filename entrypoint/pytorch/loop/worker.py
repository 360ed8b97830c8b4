"""One PyTorch training process: join the process group and run the hooks loop, or run the user's script.

Runs in the node's own process (one process per node) or in ``python -m entrypoint.worker`` started
by torch's elastic agent; either way it receives its plan already placed at its rank.

A gloo process group that ``destroy_process_group`` dropped is kept alive to the process's end
(``keep_gloo_groups``), which leaves without finalization while its threads live (``lifecycle/shutdown.py``): torch
2.13's ``~ProcessGroupGloo`` joins its worker threads holding the GIL, and a worker freeing a finished collective
whose tensor's Python object only it still owned waits for the GIL: a deadlock. A DDP script's ``main()`` returning
after ``destroy_process_group`` drops its model, and with it the group's last reference (DDP's reducer): 2 DDP script
jobs in 5 hung there under the fork server at load 10-13 (docs/ARCHITECTURE.md, "Process exit").
"""

from __future__ import annotations

import functools
import os
from datetime import timedelta
from typing import Any

from entrypoint.cluster import envvars as ev
from entrypoint.failures import FailureContext
from entrypoint.lifecycle.signals import stop_at_once
from entrypoint.planning.plan import Plan
from entrypoint.planning.usercode import run_script

STARTING = "starting the training process: nothing trained in this attempt, so nothing to commit"
_KEPT: list[Any] = []  # gloo process groups destroyed by the script or the loop, never destructed (see above)


def keep_gloo_groups() -> None:
    """Have ``torch.distributed.destroy_process_group`` keep a reference to each gloo group it destroys (once)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    original = c10d.destroy_process_group
    if getattr(original, "keeps_gloo_groups", False):
        return

    @functools.wraps(original)
    def destroy_process_group(group: Any = None) -> None:
        world = group is None or group == c10d.GroupMember.WORLD
        _KEPT.extend(pg for pg in (list(c10d._world.pg_map) if world else [group]) if _gloo(c10d, pg))
        original(group)

    destroy_process_group.keeps_gloo_groups = True  # type: ignore[attr-defined]
    c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group  # torch.distributed's own name is bound to the original too


def _gloo(c10d: Any, pg: Any) -> bool:
    try:
        return "gloo" in str(c10d.get_backend(pg))
    except (RuntimeError, ValueError):
        return False


def run(plan: Plan, failure_context: FailureContext) -> int:
    """This process's part of the job; its exit code (a script's own, or 0 after the loop)."""
    code, placed = plan.require_code(), plan.placed
    if not plan.topology.processes_started_externally:
        # torch's agent counts only its own restarts of the workers (never: max_restarts is 0); the count
        # users read is how often the platform restarted this replica, which only the plan knows.
        os.environ[ev.TORCHELASTIC_RESTART_COUNT] = str(plan.restart_count)
    keep_gloo_groups()
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
