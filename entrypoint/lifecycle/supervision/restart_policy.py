"""What a platform does when a replica exits: restart it in place, restart the whole job, or end the job.

``local`` emulates the platforms with these rules (docs/recovery.md has the sources):

- ``vertex`` (Vertex AI's default): a replica that exits retryable (128 or more, or killed by a signal)
  is restarted in place, with the same CLUSTER_SPEC, address and port, up to ``max_restarts`` times (5 on
  Vertex); a replica past its budget makes the platform retry the whole job, up to ``job_retries`` times (3).
- ``job`` (``scheduling.restartJobOnWorkerRestart``): one replica's retryable exit restarts every replica,
  up to ``max_restarts`` times.
- ``exitcode`` (Kubeflow's ``restartPolicy: ExitCode``): a pod that exits with 128 or more is restarted in
  place; ``backoff_limit`` bounds the restarts of all pods together.
- ``never``: the first failure ends the job.

A permanent exit (1-127) always ends the job at once: no platform retries what cannot succeed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from entrypoint.errors import ConfigError, is_retryable

POLICIES = ("vertex", "job", "exitcode", "never")
VERTEX_RESTARTS_PER_REPLICA = 5  # Vertex AI restarts a failed worker up to 5 times ...
VERTEX_JOB_RETRIES = 3  # ... then retries the whole job up to 3 times before the job fails
DEFAULT_BACKOFF_LIMIT = 6  # Kubernetes Jobs' default; Kubeflow's runPolicy.backoffLimit has none (no bound)

Action = Literal["restart_replica", "restart_job", "end"]


@dataclass(frozen=True)
class RestartPolicy:
    """How many restarts, of what, a platform grants."""

    kind: str = "vertex"
    max_restarts: int = VERTEX_RESTARTS_PER_REPLICA
    job_retries: int = VERTEX_JOB_RETRIES
    backoff_limit: int = DEFAULT_BACKOFF_LIMIT

    def __post_init__(self) -> None:
        if self.kind not in POLICIES:
            raise ConfigError("--restart-policy", f"expected one of {', '.join(POLICIES)}")
        if min(self.max_restarts, self.job_retries, self.backoff_limit) < 0:
            raise ConfigError("--restart-policy", "restart budgets must be >= 0")

    def describe(self) -> str:
        """One line for the start of a job: what happens when a replica fails."""
        if self.kind == "vertex":
            return (f"restart policy vertex: a replica exiting >= 128 restarts in place (up to {self.max_restarts} "
                    f"times each), then the whole job is retried (up to {self.job_retries} times)")
        if self.kind == "job":
            return f"restart policy job (restartJobOnWorkerRestart): a failure restarts every replica, up to " \
                   f"{self.max_restarts} times"
        if self.kind == "exitcode":
            return f"restart policy exitcode (Kubeflow ExitCode): a replica exiting >= 128 restarts in place, " \
                   f"backoffLimit {self.backoff_limit} for the whole job"
        return "restart policy never: the first failure ends the job"


@dataclass
class Counts:
    """The restarts granted so far."""

    per_replica: dict[str, int] = field(default_factory=dict)
    job: int = 0  # whole-job restarts (job policy) or retries (vertex)
    # every replica restart of the run, across job retries (what ``local`` reports; no budget reads it)
    replica_restarts: int = field(default=0, compare=False)

    @property
    def total(self) -> int:
        """Restarts of single replicas, summed."""
        return sum(self.per_replica.values())

    def of(self, replica: str) -> int:
        """Restarts of ``replica`` since the job (or its latest retry) started."""
        return self.per_replica.get(replica, 0)

    def grant(self, replica: str) -> int:
        """Count one more restart of ``replica``; its restarts since the job (or its latest retry) started."""
        self.per_replica[replica] = self.of(replica) + 1
        self.replica_restarts += 1
        return self.of(replica)


@dataclass(frozen=True)
class Decision:
    """What the platform does about one replica's exit, and the budget it counts against."""

    action: Action
    number: int = 0  # this restart's number (1 for the first)
    budget: int = 0  # of how many
    why: str = ""  # for an ``end``: why the job ends


def decide(policy: RestartPolicy, counts: Counts, replica: str, code: int) -> Decision:
    """The platform's answer to ``replica`` exiting with ``code`` (non-zero); updates ``counts``."""
    if not is_retryable(code):
        return Decision("end", why="a permanent failure (exit code below 128) is never retried")
    if policy.kind == "never":
        return Decision("end", why="--restart-policy never")
    if policy.kind == "job":
        if counts.job >= policy.max_restarts:
            return Decision("end", budget=policy.max_restarts,
                            why=f"the job was restarted {counts.job} times (budget {policy.max_restarts})")
        counts.job += 1
        return Decision("restart_job", counts.job, policy.max_restarts)
    if policy.kind == "exitcode":
        if counts.total >= policy.backoff_limit:
            return Decision("end", budget=policy.backoff_limit,
                            why=f"{counts.total} pod restarts reached backoffLimit {policy.backoff_limit}")
        return Decision("restart_replica", counts.grant(replica), policy.backoff_limit)
    if counts.of(replica) < policy.max_restarts:
        return Decision("restart_replica", counts.grant(replica), policy.max_restarts)
    if counts.job < policy.job_retries:
        counts.job += 1
        counts.per_replica.clear()  # a retried job starts with fresh budgets
        return Decision("restart_job", counts.job, policy.job_retries)
    return Decision("end", budget=policy.max_restarts,
                    why=f"{replica} was restarted {policy.max_restarts} times and the job retried "
                        f"{counts.job} times (Vertex's budgets: {policy.max_restarts} and {policy.job_retries})")
