"""``python -m entrypoint.worker``: one training process started by a launcher (torch elastic, Horovod).

It binds its life to its launcher's first (``die_with_parent``, the launcher's pid read from the plan file's name),
before importing anything heavy or reading the plan: a launcher killed as it starts its workers (its node SIGKILLed)
takes them with it, silently (exit 137), instead of leaving them to run on and report its vanished plan as a
configuration error. Then it reads the plan its launcher handed it (TRAINER_PLAN_FILE), places itself at its local
rank, and runs the framework's worker through the failure funnel. Under torch's elastic
agent the entry is also wrapped with torch's ``record`` (the funnel writes torch's error file itself).
"""

from __future__ import annotations

from entrypoint.lifecycle.signals import die_with_parent
from entrypoint.planning import handoff


def main() -> int:
    """Run this worker; its exit code."""
    handed = handoff.read()
    # torch's agent starts its workers in sessions of their own: a SIGKILL of the node's process group misses them
    die_with_parent(expected_parent=handoff.parent_of_worker(handoff.launcher_of(handed)))
    from entrypoint.lifecycle.runner import run_worker

    if handed.error_file is None:
        return run_worker(handed)
    from torch.distributed.elastic.multiprocessing.errors import record

    return int(record(run_worker)(handed) or 0)


if __name__ == "__main__":
    from entrypoint.lifecycle.shutdown import end

    end(main())
