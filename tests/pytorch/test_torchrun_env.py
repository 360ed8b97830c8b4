"""Script mode plays torchrun: the same variables, with the same values, as a real torchrun gives the same script.

A probe script dumps its environment under a real ``torchrun`` (one node and a two-node static rendezvous on
127.0.0.1, one and two processes per node) and under ours (``run`` and ``local --workers 2``: the in-process path
for one process per node, torch's agent for two); Kubeflow's elastic echo pattern then runs unchanged on both paths.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint.lifecycle.startup.ports import free_ports
from tests.conftest import PYTHON, ROOT, subprocess_env
from tests.runs import entrypoint, failure_text

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
PROBE, ECHO = "tests/pytorch/env_probe.py", "tests/pytorch/elastic_echo.py"
TORCHRUN = [str(Path(PYTHON).with_name("torchrun"))] if Path(PYTHON).with_name("torchrun").exists() else \
    [sys.executable, "-m", "torch.distributed.run"]
# torchrun's variables whose values must be equal, rank by rank (the others differ by nature: ports, run ids, paths).
SAME_VALUE = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME",
              "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
              "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_SIGNALS_TO_HANDLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
              "OMP_NUM_THREADS")
# What ours adds on purpose (docs/ENVIRONMENT.md): Vertex's variables, the plan, the node's own names.
OURS = re.compile(r"^(AIP_|CLOUD_ML_|TRAINER_|CLUSTER_SPEC$|TF_CONFIG$|NODE_RANK$|NNODES$|TMPDIR$)")
SHELL = {"_", "PWD", "SHLVL", "OLDPWD"}


def _set_by_launcher(out: Path, given: dict[str, str]) -> dict[int, dict[str, str]]:
    """Each rank's variables that its launcher set or changed (not those the test passed in)."""
    found = {}
    for path in sorted(out.glob("env-*.json")):
        env = json.loads(path.read_text())
        found[int(env["RANK"])] = {k: v for k, v in env.items() if given.get(k) != v and k not in SHELL}
    return found


def _torchrun(tmp_path: Path, nodes: int, nproc: int) -> dict[int, dict[str, str]]:
    """The probe under a real torchrun: one node, or ``nodes`` agents meeting in a static rendezvous."""
    out, env = tmp_path / "torchrun", subprocess_env()
    if nodes == 1:
        commands = [[*TORCHRUN, "--nnodes", "1", "--nproc-per-node", str(nproc), PROBE, str(out)]]
    else:
        port = free_ports(1)[0]
        commands = [[*TORCHRUN, "--nnodes", str(nodes), "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                     "--master-port", str(port), "--nproc-per-node", str(nproc), PROBE, str(out)]
                    for rank in range(nodes)]
    agents = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for c in commands]
    for agent in agents:
        output, _ = agent.communicate(timeout=240)
        assert agent.returncode == 0, output[-3000:]
    return _set_by_launcher(out, env)


def _ours(tmp_path: Path, nodes: int, nproc: int, restarts: str | None) -> dict[int, dict[str, str]]:
    # TRAINER_CPUS unset, as under torchrun: `local` still gives each replica its share of this host's CPUs
    out, extra = tmp_path / "ours", {"TRAINER_CPUS": "", **({"TRAINER_RESTART_COUNT": restarts} if restarts else {})}
    run = ["run", "--framework", "pytorch", "--timeout", "120", "--nproc-per-node", str(nproc), "--script", PROBE]
    if nodes == 1:
        proc = entrypoint(*run, "--job-dir", str(tmp_path / "job"), "--", str(out), env=extra)
    else:
        proc = entrypoint("local", "--workers", str(nodes), "--output-dir", str(tmp_path / "job"), "--", *run, "--",
                          str(out), env=extra)
    assert proc.returncode == 0, failure_text(proc)
    return _set_by_launcher(out, subprocess_env(extra))


@pytest.mark.parametrize(("nodes", "nproc"), [(1, 1), (1, 2), (2, 1), (2, 2)],
                         ids=["1-node-1-proc", "1-node-2-procs", "2-nodes-1-proc", "2-nodes-2-procs"])
def test_script_mode_sets_what_torchrun_sets_with_its_values(tmp_path: Path, nodes: int, nproc: int) -> None:
    reference = _torchrun(tmp_path, nodes, nproc)
    restarts = "2" if nodes == 1 else None  # `local` sets each replica's count itself (0: the first attempt)
    ours = _ours(tmp_path, nodes, nproc, restarts)
    assert sorted(ours) == sorted(reference) == list(range(nodes * nproc))
    share = max(1, len(os.sched_getaffinity(0)) // nodes)  # what `local` gives each replica
    for rank, theirs in reference.items():
        mine = dict(ours[rank])
        if nodes > 1 and "OMP_NUM_THREADS" not in theirs:  # torchrun's agents share the host without a word
            assert mine.pop("OMP_NUM_THREADS") == str(max(1, share // nproc)), f"rank {rank}"
        assert sorted(theirs) == sorted(k for k in mine if not OURS.match(k)), f"rank {rank}"
        expected = {k: theirs[k] for k in SAME_VALUE if k in theirs}
        if restarts:
            expected["TORCHELASTIC_RESTART_COUNT"] = restarts  # the platform's restarts of this replica
        assert {k: mine[k] for k in expected} == expected, f"rank {rank}"
    run_ids = {env["TORCHELASTIC_RUN_ID"] for env in ours.values()}
    masters = {(env["MASTER_ADDR"], env["MASTER_PORT"]) for env in ours.values()}
    assert len(run_ids) == 1 and len(masters) == 1  # one job, one store


@pytest.mark.parametrize("nproc", [1, 2], ids=["in-process", "torch-agent"])
def test_kubeflow_elastic_echo_pattern_runs_unchanged(tmp_path: Path, nproc: int) -> None:
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(tmp_path), "--", "run", "--framework", "pytorch",
                      "--timeout", "120", "--nproc-per-node", str(nproc), "--script", ECHO, timeout=300)
    assert proc.returncode == 0, failure_text(proc)
    world = 2 * nproc
    lines = re.findall(r"after init process group, rank=(\d), world_size = (\d), run id (\S+)", proc.stdout)
    assert sorted(int(rank) for rank, _, _ in lines) == list(range(world))
    assert {(size, run_id) for _, size, run_id in lines} == {(str(world), lines[0][2])}
    assert "KeyError" not in proc.stdout + proc.stderr
