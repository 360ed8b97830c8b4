"""The small context API for scripts: who am I, where do outputs go, report a tuning metric, stop politely.
(``lifecycle/script_context.py`` answers; this is its public path.)

    from entrypoint import context
    if context.is_chief():
        model.save(context.model_dir())
    context.report_metric("accuracy", acc, step)
    context.step_done(step)          # optional: the job's goodput counts the script's steps
    if context.preempted():          # SIGTERM arrived: save, then leave
        save_checkpoint(); sys.exit(143)

Under the entrypoint the answers come from the plan the runner binds before the user's code starts
(``bind``); a process the user's code started itself finds the plan its launcher handed over
(TRAINER_PLAN_FILE), and a script started some other way gets them from the cluster environment.
"""

from entrypoint.lifecycle.script_context import (
    bind,
    checkpoint_dir,
    finish,
    is_chief,
    local_rank,
    model_dir,
    placement,
    preempted,
    rank,
    report_metric,
    step_done,
    tensorboard_dir,
    topology,
    world_size,
)

__all__ = ["bind", "checkpoint_dir", "finish", "is_chief", "local_rank", "model_dir", "placement", "preempted", "rank",
           "report_metric", "step_done", "tensorboard_dir", "topology", "world_size"]
