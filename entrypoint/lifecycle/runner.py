"""One path from the plan to the training process, for every framework.

``run_node`` (the ``run`` command, once per node): meet the peers, hand the plan to the framework's
launcher (which runs the training in this process or starts one process per GPU), and name the root
cause when it fails. ``run_worker`` (``python -m entrypoint.worker``, a process the launcher started):
load the plan, die with the launcher, run the framework's worker. Both go through ``failures.guarded``.
Launchers and workers are called with the plan and the failure context (``launch(plan, ctx)``,
``run(plan, ctx)``) and hand both on; nothing is fetched from process-wide state.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

from entrypoint import failures
from entrypoint.cluster import envvars as ev
from entrypoint.cluster import fabric
from entrypoint.cluster.environments.settings import (
    Handoff,
    job_lease_token,
    read_settings,
    secret_values,
    secrets_in_args,
)
from entrypoint.errors import ConfigError, ExitCode
from entrypoint.lifecycle import script_context as context
from entrypoint.lifecycle import shutdown, signals
from entrypoint.lifecycle.jobdir import jobrecord, lease
from entrypoint.lifecycle.recorder import NodeRecorder
from entrypoint.lifecycle.startup import rendezvous
from entrypoint.outputs import checkpoints
from entrypoint.outputs.goodput import ledger
from entrypoint.outputs.locations import ensure_writable, how_written
from entrypoint.planning import handoff, registry
from entrypoint.planning.plan import Plan

log = logging.getLogger("entrypoint")
REFUSED = "trainer-refused"  # under the temp dir: the records of a job refused (or displaced from) its job dir


def refused_records() -> str:
    """Where a job that does not hold its job dir records its failures: this node's temp dir, never the other
    job's ``failures/`` (whose chief would name them as its own root cause)."""
    return os.path.join(tempfile.gettempdir(), REFUSED)


def describe_failures(ctx: failures.FailureContext, plan: Plan) -> failures.FailureContext:
    """Fill in who this process is and where its failures go, from the plan."""
    ctx.replica = plan.topology.replica_name
    ctx.rank = plan.placement.rank if plan.placement is not None else None
    ctx.job_dir = plan.outputs.job_dir
    ctx.outputs = (plan.outputs.job_dir, plan.outputs.model_dir, plan.outputs.checkpoint_dir,
                   plan.outputs.tensorboard_dir)
    ctx.secrets = secret_values() | frozenset(secrets_in_args(plan.options.user_args))
    ctx.hooks = plan.code is not None and plan.code.kind == "hooks"
    ctx.termination_log = read_settings().kubernetes
    return ctx


def run_node(plan: Plan, ctx: failures.FailureContext) -> int:
    """Run this node's part of the job; a non-zero exit names the job's root cause on the last line."""
    user_code = plan.require_code()
    prepare_fabric(plan)
    out = plan.outputs
    log.info("outputs: job dir %s; model %s; checkpoints %s; tensorboard %s", how_written(out.job_dir),
             how_written(out.model_dir), how_written(out.checkpoint_dir), how_written(out.tensorboard_dir))
    if user_code.kind != "hooks":  # scripts write into AIP_MODEL_DIR & co. as into a bucket, where every path exists
        ensure_writable([out.model_dir, out.checkpoint_dir, out.tensorboard_dir])
    try:
        with holding_job_dir(plan, ctx) as record:
            # The job ledger (docs/goodput.md): the chief's attempt once it holds the job dir (a refused duplicate
            # writes nothing); another replica's past the barrier, where it sees the chief's (a shared job dir).
            chief = _is_chief(plan)
            if chief:
                start_ledger(plan, ctx)
            with signals.stop_at_once("meeting the other replicas at the start-up barrier"):
                rendezvous.meet_peers(plan)
            if not chief:
                _ledger_once_shared(plan, ctx)
            os.environ.update(plan.emitted_env())  # what user code and children expect (TF_CONFIG, AIP_*, MASTER_*)
            with handoff.plan_file(plan) as handed:
                os.environ.update(handed)
                code = registry.get(plan.framework).load_launcher()(plan, ctx)
            if code == ExitCode.OK and record is not None:
                jobrecord.finished(out.job_dir, record)
    except BaseException:
        _records_outside_anothers(plan, ctx)
        raise
    if code == ExitCode.OK:
        if ctx.on_end is not None:  # this node's attempt in the ledger, when it has one
            ctx.on_end(ExitCode.OK, None, None)
        return ExitCode.OK
    _records_outside_anothers(plan, ctx)
    return failures.finish_node(ctx, code)


def _ledger_once_shared(plan: Plan, ctx: failures.FailureContext) -> None:
    """Another replica's attempt goes into the ledger once it sees the chief's there (a shared job dir); PyTorch's
    launcher meets the chief later, in the job's store, so this looks every second until ``--timeout``, beside."""
    def look() -> None:
        deadline = time.monotonic() + plan.options.timeout
        while time.monotonic() < deadline:
            if ledger.shared(plan.outputs.job_dir):
                start_ledger(plan, ctx)
                return
            time.sleep(1.0)

    threading.Thread(target=look, name="ledger-start", daemon=True).start()


def _is_chief(plan: Plan) -> bool:
    """The job's chief node (under torchrun or mpirun, a process per ``run``: the chief's process)."""
    return plan.topology.is_chief_node and (plan.placement is None or plan.placement.is_chief)


def start_ledger(plan: Plan, ctx: failures.FailureContext) -> NodeRecorder | None:
    """This node's attempt in the job ledger (docs/goodput.md): its start now, its end when ``failures.finish``
    or ``run_node`` ends it; its training processes write under the same attempt (``TRAINER_ATTEMPT``)."""
    if ctx.job_dir is None or ctx.job_dir == refused_records():
        return None
    topo = plan.topology
    node = NodeRecorder(plan.outputs.job_dir, topo.replica_name, _is_chief(plan),
                        {"job": job_key(plan), "role": topo.role, "framework": plan.framework,
                         "code": plan.require_code().kind, "processes": plan.nproc_per_node,
                         "restart_count": plan.restart_count})
    os.environ[ev.TRAINER_ATTEMPT] = node.attempt

    def end(code: int, failure_class: str | None, line: str | None) -> None:
        if ctx.job_dir != refused_records():  # a job displaced from its job dir writes nothing more there
            node.end(code, failure_class, line)

    ctx.on_end = end
    return node


def _records_outside_anothers(plan: Plan, ctx: failures.FailureContext) -> None:
    """A node of a job that does not hold its job dir (a refused duplicate's worker, failing while it waits for
    its chief; a displaced job's) records its failure in its temp dir: another job's lease is in the dir."""
    if ctx.job_dir is not None and ctx.job_dir != refused_records() and \
            lease.held_by_another_job(plan.outputs.job_dir, job_key(plan), job_lease_token()):
        ctx.job_dir = refused_records()


def prepare_fabric(plan: Plan) -> fabric.FabricStep:
    """The GPU fabric step (docs/fabric.md), before any training process starts: this process's environment, which
    every training process inherits, gets what the host's profile exports and loses the strays; logged by name."""
    settings = read_settings()
    if settings.fabric_applied:  # this process is the entrypoint started again with the step applied (below)
        return fabric.FabricStep("applied")
    step = fabric.prepare(fabric.mode_of(plan.options.fabric, settings.fabric), os.environ, settings.fabric_root)
    for line in step.lines():
        (log.warning if step.problem and line.startswith(f"fabric: {step.problem}") else log.info)(line)
    if fabric.apply(step, os.environ):
        # The dynamic loader read LD_LIBRARY_PATH when this process started: a framework that trains in this
        # process (TensorFlow, a node of one PyTorch process) would load an NCCL that cannot find the plugin.
        # The same command starts again, in the same process (the platform sees no change), with the step applied.
        os.environ[ev.TRAINER_FABRIC_APPLIED] = "1"
        log.info("fabric: the entrypoint starts again with the plugin's directory on its library path")
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for handler in logging.getLogger().handlers + log.handlers:
            handler.flush()
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    return step


def job_key(plan: Plan) -> str | None:
    """What every attempt of this job shares and another job does not: its cluster's chief and its trial (None for
    a job without a cluster, told apart by its holder's process instead)."""
    topo = plan.topology
    return None if topo.chief_address is None else f"{topo.source}:{topo.chief_address}:{topo.trial or '-'}"


def refuse_if_in_use(plan: Plan, ctx: failures.FailureContext) -> None:
    """A chief whose job dir another live job holds is refused before anything else is checked (a job dir that is
    not writable now, say, because the job that holds it made it so): the same line ``holding_job_dir`` gives."""
    if plan.topology.is_chief_node and (plan.placement is None or plan.placement.is_chief):
        refused = lease.in_use(plan.outputs.job_dir)
        if refused is not None:
            ctx.job_dir = refused_records()  # the other job's failures/ are its own
            raise refused


@contextlib.contextmanager
def holding_job_dir(plan: Plan, ctx: failures.FailureContext) -> Iterator[jobrecord.JobRecord | None]:
    """The chief holds the job dir while the node runs (``lease.py``) and compares its arguments with the recorded
    ones (``jobrecord.py``): before anything trains or meets a peer. Other processes hold nothing (None)."""
    if not plan.topology.is_chief_node or (plan.placement is not None and not plan.placement.is_chief):
        yield None
        return
    held = lease.JobLease(plan.outputs.job_dir, job_key(plan), on_lost=lambda holder: _displaced(ctx, holder))
    try:
        held.acquire()
    except ConfigError:
        ctx.job_dir = refused_records()  # the other job's failures/ are its own
        raise
    os.environ[ev.TRAINER_JOB_LEASE] = held.me.token  # the node's training processes fence their commits with it
    try:
        with checkpoints.fence(held.check):  # and so does this process (training in it, one process per node)
            yield jobrecord.start(plan.outputs.job_dir, plan.options, ctx.secrets, plan.framework, plan.code)
        held.check()  # a launcher that ended because a worker's commit was fenced: the takeover is the cause
    except BaseException as exc:
        if held.lost is None:
            with contextlib.suppress(ConfigError):
                held.check()
        if held.lost is not None:
            ctx.job_dir = refused_records()
            if not isinstance(exc, ConfigError):
                raise lease.taken_over(plan.outputs.job_dir, held.lost) from exc
        raise
    finally:
        held.release()


def _displaced(ctx: failures.FailureContext, holder: lease.Holder) -> None:
    """Another job took the job dir over while this one ran (the lease's renewing thread found it): end this node's
    training at once, its processes SIGKILLed (no last checkpoint, export or summary), the failure recorded in the
    temp dir, and exit 2 with a last line naming the job dir and the new holder."""
    job_dir = ctx.job_dir or ""
    ctx.job_dir = refused_records()
    signals.kill_descendants()
    own = failures.write_record(ctx, failures.classify(lease.taken_over(job_dir, holder)))
    shutdown.now(failures.finish(ctx, own))


def run_process(plan: Plan, ctx: failures.FailureContext) -> int:
    """Run one training process of ``plan`` (already placed at its local rank) in this process."""
    context.bind(plan)  # what a script's ``entrypoint.context`` calls answer from
    describe_failures(ctx, plan)
    try:
        code = registry.get(plan.framework).load_worker()(plan, ctx)
    except BaseException:
        context.finish(1)
        raise
    context.finish(code)
    if code != ExitCode.OK:  # the user's script exited non-zero: recorded like any other failure
        own = failures.write_record(ctx, failures.exit_failure(code, f"the user's {plan.require_code().kind} "
                                                                     f"exited with {code}"))
        if not ctx.top_level:  # a worker ends here; in the node's own process run_node names the root cause
            failures.finish(ctx, own)
    return code


def _still_held(plan: Plan, ctx: failures.FailureContext) -> None:
    """A training process's commit fence: the job dir's lease still carries its chief's token."""
    token = job_lease_token()
    if not token:
        return
    holder = lease.held_by_another_job(plan.outputs.job_dir, job_key(plan), token)
    if holder is not None:
        ctx.job_dir = refused_records()
        raise lease.taken_over(plan.outputs.job_dir, holder)


def run_worker(handed: Handoff) -> int:
    """``python -m entrypoint.worker``: a process started by a launcher (torch elastic, Horovod)."""
    from entrypoint.outputs.progress import setup_logging

    ctx = failures.FailureContext(top_level=False, error_file=handed.error_file)

    def body() -> int:
        plan, launcher = handoff.load(handed)
        signals.die_with_parent(expected_parent=handoff.parent_of_worker(launcher))
        # its rank on each line, unless its launcher prints every line of it behind one already (Horovod's "[rank-0]")
        setup_logging("" if registry.get(plan.framework).prefixed_output else f"[{plan.placed.label()}] ")
        with checkpoints.fence(lambda: _still_held(plan, ctx)):
            try:
                return run_process(plan, ctx)
            except BaseException:
                _records_outside_anothers(plan, ctx)  # a worker failing after its job was displaced: not there
                raise

    return failures.guarded(body, ctx)
