"""The platforms' restart rules as ``local`` emulates them (``restarts.decide``): pure, no processes."""

from __future__ import annotations

import pytest

from entrypoint.errors import ConfigError
from entrypoint.lifecycle.supervision.restart_policy import Counts, RestartPolicy, decide


def test_vertex_restarts_a_replica_five_times_then_retries_the_job_three_times() -> None:
    policy, counts = RestartPolicy("vertex"), Counts()
    actions = []
    for _ in range(5 * 4 + 3 + 1):
        decision = decide(policy, counts, "workerpool1-0", 137)
        actions.append((decision.action, decision.number, decision.budget))
        if decision.action == "end":
            break
    per_round = [("restart_replica", n, 5) for n in range(1, 6)]
    assert actions == [*per_round, ("restart_job", 1, 3), *per_round, ("restart_job", 2, 3), *per_round,
                       ("restart_job", 3, 3), *per_round, ("end", 0, 5)]
    assert "workerpool1-0 was restarted 5 times and the job retried 3 times" in decide(policy, counts,
                                                                                       "workerpool1-0", 137).why


def test_budgets_are_per_replica_under_vertex() -> None:
    policy, counts = RestartPolicy("vertex", max_restarts=1, job_retries=0), Counts()
    assert decide(policy, counts, "workerpool1-0", 137).action == "restart_replica"
    assert decide(policy, counts, "workerpool1-1", 143).action == "restart_replica"
    assert decide(policy, counts, "workerpool1-0", 129).action == "end"


@pytest.mark.parametrize("kind", ["vertex", "job", "exitcode", "never"])
@pytest.mark.parametrize("code", [1, 2, 65, 73, 74, 127])
def test_a_permanent_exit_is_never_restarted(kind: str, code: int) -> None:
    decision = decide(RestartPolicy(kind), Counts(), "workerpool0-0", code)
    assert decision.action == "end" and "permanent" in decision.why


def test_job_policy_restarts_every_replica_up_to_its_budget() -> None:
    policy, counts = RestartPolicy("job", max_restarts=2), Counts()
    assert [decide(policy, counts, r, 137).action for r in ("workerpool1-0", "workerpool0-0", "workerpool1-0")] == \
        ["restart_job", "restart_job", "end"]


def test_exitcode_policy_counts_every_pod_against_one_backoff_limit() -> None:
    policy, counts = RestartPolicy("exitcode", backoff_limit=3), Counts()
    decisions = [decide(policy, counts, r, 130) for r in ("worker-0", "worker-1", "master-0", "worker-0")]
    assert [d.action for d in decisions] == ["restart_replica"] * 3 + ["end"]
    assert "3 pod restarts reached backoffLimit 3" in decisions[-1].why


def test_never_ends_at_the_first_failure() -> None:
    assert decide(RestartPolicy("never"), Counts(), "workerpool1-0", 137).action == "end"


@pytest.mark.parametrize(("kind", "budgets"), [("kubernetes", {}), ("vertex", {"max_restarts": -1}),
                                               ("job", {"backoff_limit": -2})])
def test_bad_policies_are_configuration_errors(kind: str, budgets: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        RestartPolicy(kind, **budgets)


def test_replica_restarts_are_counted_across_job_retries() -> None:
    """What ``local`` reports at the end: every restart in place, also those before a job retry cleared the budgets."""
    policy, counts = RestartPolicy("vertex", max_restarts=1, job_retries=1), Counts()
    kinds = [decide(policy, counts, "workerpool1-0", 143).action for _ in range(4)]
    assert kinds == ["restart_replica", "restart_job", "restart_replica", "end"]
    assert (counts.replica_restarts, counts.total, counts.job) == (2, 1, 1)
