"""``restarts.decide`` as a table: every policy x the exit codes of errors.py x the budget left.

test_restarts.py walks whole budgets and per-replica counting; this table pins the first answer for every
exit code of the table, and the answer at the edge of every budget. Pure: no processes.
"""

from __future__ import annotations

import copy

import pytest

from entrypoint.errors import ExitCode
from entrypoint.lifecycle.supervision.restart_policy import POLICIES, Counts, Decision, RestartPolicy, decide

PERMANENT = [int(c) for c in ExitCode if c < 128] + [3, 127]  # 0 included: decide never restarts it either
RETRYABLE = [int(c) for c in ExitCode if c >= 128] + [128, 134, 137, 139, 255]
FIRST = {"vertex": ("restart_replica", 1, 5), "job": ("restart_job", 1, 5), "exitcode": ("restart_replica", 1, 6),
         "never": ("end", 0, 0)}
R = "workerpool1-0"


def answer(decision: Decision) -> tuple[str, int, int]:
    return decision.action, decision.number, decision.budget


@pytest.mark.parametrize("kind", POLICIES)
@pytest.mark.parametrize("code", PERMANENT)
def test_a_permanent_code_ends_the_job_under_every_policy_and_counts_nothing(kind: str, code: int) -> None:
    counts = Counts()
    decision = decide(RestartPolicy(kind), counts, R, code)
    assert answer(decision) == ("end", 0, 0)
    assert decision.why == "a permanent failure (exit code below 128) is never retried"
    assert counts == Counts()


@pytest.mark.parametrize("kind", POLICIES)
@pytest.mark.parametrize("code", RETRYABLE)
def test_the_first_retryable_exit_under_the_default_budgets(kind: str, code: int) -> None:
    counts = Counts()
    decision = decide(RestartPolicy(kind), counts, R, code)
    assert answer(decision) == FIRST[kind]
    assert decision.why == ("--restart-policy never" if kind == "never" else "")
    assert (counts.total, counts.job) == {"vertex": (1, 0), "job": (0, 1), "exitcode": (1, 0), "never": (0, 0)}[kind]


# (policy, counts before, expected answer, counts after): the edges of each budget.
EDGES = [
    pytest.param(RestartPolicy("vertex", max_restarts=2, job_retries=1), Counts({R: 1}), ("restart_replica", 2, 2),
                 Counts({R: 2}), id="vertex: the last restart in place"),
    pytest.param(RestartPolicy("vertex", max_restarts=2, job_retries=1), Counts({R: 2, "workerpool0-0": 1}),
                 ("restart_job", 1, 1), Counts({}, 1), id="vertex: past the replica's budget the job is retried, "
                                                          "every budget fresh"),
    pytest.param(RestartPolicy("vertex", max_restarts=2, job_retries=1), Counts({R: 2}, 1), ("end", 0, 2),
                 Counts({R: 2}, 1), id="vertex: both budgets spent"),
    pytest.param(RestartPolicy("vertex", max_restarts=2, job_retries=1), Counts({"workerpool1-1": 2}, 1),
                 ("restart_replica", 1, 2), Counts({"workerpool1-1": 2, R: 1}, 1),
                 id="vertex: another replica's restarts do not count"),
    pytest.param(RestartPolicy("vertex", max_restarts=0, job_retries=0), Counts(), ("end", 0, 0), Counts(),
                 id="vertex: no budgets at all"),
    pytest.param(RestartPolicy("vertex", max_restarts=0, job_retries=2), Counts(), ("restart_job", 1, 2),
                 Counts({}, 1), id="vertex: no restarts in place, straight to a job retry"),
    pytest.param(RestartPolicy("job", max_restarts=3), Counts({}, 2), ("restart_job", 3, 3), Counts({}, 3),
                 id="job: the last restart"),
    pytest.param(RestartPolicy("job", max_restarts=3), Counts({}, 3), ("end", 0, 3), Counts({}, 3),
                 id="job: budget spent"),
    pytest.param(RestartPolicy("job", max_restarts=0), Counts(), ("end", 0, 0), Counts(), id="job: no budget"),
    pytest.param(RestartPolicy("exitcode", backoff_limit=3), Counts({"worker-1": 2}), ("restart_replica", 1, 3),
                 Counts({"worker-1": 2, R: 1}), id="exitcode: the last pod restart of the job"),
    pytest.param(RestartPolicy("exitcode", backoff_limit=3), Counts({"worker-1": 2, "worker-0": 1}), ("end", 0, 3),
                 Counts({"worker-1": 2, "worker-0": 1}), id="exitcode: backoffLimit counts every pod"),
    pytest.param(RestartPolicy("exitcode", backoff_limit=0), Counts(), ("end", 0, 0), Counts(),
                 id="exitcode: backoffLimit 0"),
    pytest.param(RestartPolicy("never"), Counts(), ("end", 0, 0), Counts(), id="never"),
]


@pytest.mark.parametrize("code", [129, 137, 143, 197])
@pytest.mark.parametrize(("policy", "before", "expected", "after"), EDGES)
def test_the_edges_of_every_budget(policy: RestartPolicy, before: Counts, expected: tuple[str, int, int],
                                   after: Counts, code: int) -> None:
    counts = copy.deepcopy(before)  # the table's rows are shared by every code
    decision = decide(policy, counts, R, code)
    assert answer(decision) == expected
    assert counts == after  # decide updates the counts it is given
    assert bool(decision.why) is (decision.action == "end")


@pytest.mark.parametrize(("policy", "why"), [
    (RestartPolicy("vertex", max_restarts=2, job_retries=1),
     "workerpool1-0 was restarted 2 times and the job retried 1 times (Vertex's budgets: 2 and 1)"),
    (RestartPolicy("job", max_restarts=2), "the job was restarted 2 times (budget 2)"),
    (RestartPolicy("exitcode", backoff_limit=2), "2 pod restarts reached backoffLimit 2"),
    (RestartPolicy("never"), "--restart-policy never"),
])
def test_why_a_spent_budget_ends_the_job(policy: RestartPolicy, why: str) -> None:
    counts = Counts()
    decisions = [decide(policy, counts, R, 143) for _ in range(7)]
    assert decisions[-1].action == "end" and decisions[-1].why == why


@pytest.mark.parametrize(("policy", "words"), [
    (RestartPolicy("vertex"), ["restarts in place (up to 5 times each)", "retried (up to 3 times)"]),
    (RestartPolicy("job", max_restarts=4), ["restartJobOnWorkerRestart", "up to 4 times"]),
    (RestartPolicy("exitcode", backoff_limit=2), ["Kubeflow ExitCode", "backoffLimit 2"]),
    (RestartPolicy("never"), ["the first failure ends the job"]),
])
def test_each_policy_describes_itself_in_one_line(policy: RestartPolicy, words: list[str]) -> None:
    line = policy.describe()
    assert "\n" not in line and all(w in line for w in words), line
