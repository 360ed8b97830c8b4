"""``--init-from`` is planned only where a hooks loop reads it (PyTorch's, Horovod's): anywhere else it is refused
with one line, not ignored (entrypoint/planning/plan.py)."""

from __future__ import annotations

from typing import Any

import pytest

from entrypoint.cluster.environments import resolve
from entrypoint.cluster.environments.settings import PlatformSettings
from entrypoint.errors import ConfigError
from entrypoint.options import RunOptions
from entrypoint.planning.plan import Plan, make_plan


def plan(framework: str, **options: Any) -> Plan:
    return make_plan(resolve({}), RunOptions(framework=framework, init_from="gs://b/llama", **options),
                     PlatformSettings(), 0)


@pytest.mark.parametrize("framework", ["pytorch", "horovod"])
def test_a_hooks_module_of_a_framework_that_loads_it_is_planned(framework: str) -> None:
    assert plan(framework, module="trainers.digits_torch").options.init_from == "gs://b/llama"


def test_a_script_is_refused_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match="a script or plain module loads its own weights") as caught:
        plan("pytorch", script="trainers/digits_torch.py")
    assert caught.value.source == "--init-from"


def test_tensorflow_is_refused_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match="is read by the PyTorch hooks loop; TensorFlow loads its own weights"):
        plan("tensorflow", module="trainers.digits_keras")
