"""One Horovod training process: ``hvd.init()`` (gloo rendezvous with the chief), then the shared hooks loop."""

from __future__ import annotations

from entrypoint.errors import PeerError
from entrypoint.failures import FailureContext
from entrypoint.planning import handoff
from entrypoint.planning.plan import Plan
from entrypoint.planning.usercode import run_script


def run(plan: Plan, failure_context: FailureContext) -> int:
    """This process's part of the job: the user's Horovod script unchanged, or hvd.init() and our loop."""
    code = plan.require_code()
    if code.kind != "hooks":
        return run_script(code, plan.options.user_args)
    import horovod.torch as hvd
    import torch

    from entrypoint.horovod.collectives import HorovodCollectives
    from entrypoint.pytorch.loop.trainer import Trainer

    try:
        hvd.init()
    except Exception as exc:  # gloo rendezvous failed: a peer vanished after the start-up barrier
        raise PeerError(f"Horovod rendezvous failed within {plan.options.timeout:g} s: {exc}") from None
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
    try:
        comm = HorovodCollectives(handoff.read().horovod_rendezvous)  # what horovodrun or our launcher handed
        Trainer(plan, comm, failure_context).fit()  # checks hvd.rank() is the plan's
    finally:
        hvd.shutdown()
    return 0
