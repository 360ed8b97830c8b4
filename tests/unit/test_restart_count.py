"""TRAINER_RESTART_COUNT (the platform's restarts of a replica) and torchrun's defaults in the PyTorch plan."""

from __future__ import annotations

import subprocess

import pytest

from entrypoint.cluster.environments import resolve
from entrypoint.cluster.environments.settings import PlatformSettings, read_settings
from entrypoint.errors import ConfigError
from entrypoint.options import RunOptions
from entrypoint.planning.plan import make_plan
from tests.conftest import PYTHON, ROOT, subprocess_env


@pytest.mark.parametrize(("value", "count"), [(None, 0), ("", 0), ("0", 0), (" 3 ", 3), ("12", 12)])
def test_restart_count_defaults_to_zero(value: str | None, count: int) -> None:
    env = {} if value is None else {"TRAINER_RESTART_COUNT": value}
    assert read_settings(env).restart_count == count


@pytest.mark.parametrize("value", ["-1", "one", "1.5", "²", "3 restarts"])
def test_a_bad_restart_count_is_one_config_error_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        read_settings({"TRAINER_RESTART_COUNT": value})
    message = str(info.value)
    assert message.startswith("TRAINER_RESTART_COUNT: ") and "\n" not in message


def test_cli_rejects_a_bad_restart_count_in_one_line() -> None:
    proc = subprocess.run([PYTHON, "-m", "entrypoint", "describe", "--framework", "pytorch"], cwd=ROOT,
                          env=subprocess_env({"TRAINER_RESTART_COUNT": "-2"}), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("entrypoint: error: TRAINER_RESTART_COUNT: "), proc.stderr


def test_the_plan_carries_the_restart_count_to_every_process() -> None:
    plan = make_plan(resolve({}), RunOptions(framework="pytorch", nproc_per_node=2), PlatformSettings(restart_count=4),
                     0)
    assert plan.restart_count == 4 and plan.for_process(1).restart_count == 4
    assert type(plan).from_dict(plan.to_dict()).restart_count == 4  # through the plan file


@pytest.mark.parametrize(("nproc", "user", "expected"), [
    (1, {}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}),
    (2, {}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "1"}),
    (2, {"OMP_NUM_THREADS": "4", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, {}),  # the user's values win
])
def test_torchrun_defaults_unless_the_user_set_them(nproc: int, user: dict[str, str],
                                                    expected: dict[str, str]) -> None:
    plan = make_plan(resolve({}), RunOptions(framework="pytorch", nproc_per_node=nproc), read_settings(user), 0)
    env = plan.emitted_env()
    assert {k: env[k] for k in ("OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING") if k in env} == expected


def test_processes_the_platform_placed_keep_their_launchers_variables() -> None:
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
                "TORCHELASTIC_RUN_ID": "x", "MASTER_ADDR": "m", "MASTER_PORT": "1"}
    plan = make_plan(resolve(torchrun), RunOptions(framework="pytorch"), PlatformSettings(), 0)
    assert "OMP_NUM_THREADS" not in plan.emitted_env() and "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in plan.emitted_env()
