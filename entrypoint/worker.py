"""``python -m entrypoint.worker``: one training process started by a launcher (torch elastic, Horovod).

It reads the plan its launcher handed it (TRAINER_PLAN_FILE), places itself at its local rank, dies
with its launcher, and runs the framework's worker through the failure funnel. Under torch's elastic
agent the entry is also wrapped with torch's ``record`` (the funnel writes torch's error file itself).
"""

from __future__ import annotations

from entrypoint.lifecycle.runner import run_worker
from entrypoint.lifecycle.shutdown import end
from entrypoint.planning import handoff


def main() -> int:
    """Run this worker; its exit code."""
    handed = handoff.read()
    if handed.error_file is None:
        return run_worker(handed)
    from torch.distributed.elastic.multiprocessing.errors import record

    return int(record(run_worker)(handed) or 0)


if __name__ == "__main__":
    end(main())
