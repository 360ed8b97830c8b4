"""The framework registry's contract, and a toy framework added the documented way: its package plus one line.

Framework-free: a framework's ``framework.py`` imports no ML framework, and its launcher and worker are read as
source, not imported.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments import resolve
from entrypoint.cluster.environments.settings import PlatformSettings
from entrypoint.errors import ConfigError
from entrypoint.planning import registry
from entrypoint.planning.plan import make_plan
from entrypoint.planning.runargs import parse_options
from tests.conftest import PYTHON, subprocess_env

HEAVY = ("torch", "tensorflow", "horovod", "keras", "jax")


def _entry_args(target: str) -> list[str]:
    """The parameter names of a ``module:function`` target, read from its source (nothing imported)."""
    module, _, name = target.partition(":")
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, target
    tree = ast.parse(Path(spec.origin).read_text())
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name]
    assert found, f"{target}: no such function"
    return [arg.arg for arg in found[0].args.args]


@pytest.mark.parametrize("name", registry.names())
def test_every_framework_keeps_the_contract(name: str) -> None:
    framework = registry.get(name)
    assert framework.name == name and framework.strategies and framework.probe
    assert len(_entry_args(framework.launcher)) == 2  # launch(plan, ctx)
    if framework.worker is not None:
        assert len(_entry_args(framework.worker)) == 2  # run(plan, ctx)
    assert set(framework.user_variables) <= set(ev.FRAMEWORK_DEFAULTED)
    for flag in framework.flags:
        assert flag.flag.startswith("--") and flag.help
    # its lost peer is declared (else it would be the user's permanent 1): dotted type names, module prefixes
    assert framework.peer_errors and all("." in e and e.rsplit(".", 1)[1][:1].isupper() for e in framework.peer_errors)
    assert all(m and not m.endswith(".") for m in framework.peer_modules)


def test_framework_flags_do_not_clash_and_reach_only_their_options() -> None:
    flags = [flag.flag for name in registry.names() for flag in registry.get(name).flags]
    assert len(flags) == len(set(flags))
    options = parse_options("run", ["--fusion-threshold", "64", "--autotune", "--", "--lr", "1"])
    assert options.framework_option("fusion_threshold") == 64 and options.framework_option("autotune") is True
    assert options.framework_option("cycle_time_ms") is None and options.user_args == ("--lr", "1")


def test_loading_the_registry_imports_no_framework() -> None:
    probe = ("import sys; from entrypoint.planning import registry, runargs; "
             "[registry.get(n) for n in registry.names()]; runargs.parse_options('run', []); "
             f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([PYTHON, "-c", probe], env=subprocess_env(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


TOY_FRAMEWORK = '''
    """A toy framework: one process per node that writes where it was placed."""
    from entrypoint.options import positive_int
    from entrypoint.planning.registry import Flag, Framework, NodePlan


    def plan(topo, options, user_set, gpus, outputs):
        return NodePlan(strategy=options.strategy or "toy", reason="a toy", nproc_per_node=1,
                        env={"TOY_LEVEL": str(options.framework_option("toy_level", 1))})


    FRAMEWORK = Framework(name="toy", probe="json", strategies=("toy",), plan=plan,
                          launcher="toyfw.launch:launch", worker="toyfw.worker:run",
                          flags=(Flag("--toy-level", "how toy", positive_int),),
                          peer_errors=("toyfw.errors.ToyPeerLost",))
'''
TOY_LAUNCH = '''
    from entrypoint.lifecycle.runner import run_process


    def launch(plan, ctx):
        return run_process(plan.only_process(), ctx)
'''
TOY_WORKER = '''
    import json
    import os
    from pathlib import Path

    from entrypoint import context


    def run(plan, ctx):
        if os.environ["TOY_LEVEL"] == "9":  # the toy's collective lost its peer
            from toyfw.errors import ToyPeerLost

            raise ToyPeerLost("the other toy went away")
        out = {"rank": context.rank(), "world_size": context.world_size(), "chief": context.is_chief(),
               "level": os.environ["TOY_LEVEL"], "failure_rank": ctx.rank, "replica": ctx.replica}
        Path(plan.outputs.job_dir, "toy.json").write_text(json.dumps(out))
        return 0
'''


def test_a_toy_framework_is_its_package_plus_one_registry_line(tmp_path: Path) -> None:
    package = tmp_path / "toyfw"
    package.mkdir()
    for name, text in {"__init__": "", "framework": TOY_FRAMEWORK, "launch": TOY_LAUNCH, "worker": TOY_WORKER,
                       "errors": "class ToyPeerLost(Exception):\n    pass\n"}.items():
        (package / f"{name}.py").write_text(textwrap.dedent(text))
    (tmp_path / "user_module.py").write_text("")
    job = tmp_path / "job"
    main = ("import sys; from entrypoint.planning import registry; registry.REGISTRY['toy'] = 'toyfw.framework'; "
            "from entrypoint.cli import main; sys.exit(main(sys.argv[1:]))")
    env = subprocess_env({"PYTHONPATH": f"{tmp_path}:{subprocess_env()['PYTHONPATH']}"})
    run = subprocess.run([PYTHON, "-c", main, "run", "--framework", "toy", "--module", "user_module",
                          "--toy-level", "3", "--job-dir", str(job)], env=env, capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads((job / "toy.json").read_text()) == {
        "rank": 0, "world_size": 1, "chief": True, "level": "3", "failure_rank": 0, "replica": "node-0"}
    helped = subprocess.run([PYTHON, "-c", main, "run", "--help"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert "--toy-level" in helped.stdout and "toy" in helped.stdout
    lost = subprocess.run([PYTHON, "-c", main, "run", "--framework", "toy", "--module", "user_module",
                           "--toy-level", "9", "--job-dir", str(job)], env=env, capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert lost.returncode == 129, lost.stderr  # its own lost peer: retryable, as the framework declared
    assert "error: peer_lost on node-0" in lost.stderr.splitlines()[-1] and "ToyPeerLost" in lost.stderr


@pytest.mark.parametrize(("framework", "argv", "flag"), [
    ("pytorch", ["--fusion-threshold", "64"], "--fusion-threshold"),
    ("horovod", ["--recovery", "restart"], "--recovery"),
    ("tensorflow", ["--bucket-cap-mb", "25"], "--bucket-cap-mb"),
])
def test_another_frameworks_flag_is_a_config_error(framework: str, argv: list[str], flag: str) -> None:
    options = parse_options("run", ["--framework", framework, *argv])
    with pytest.raises(ConfigError, match=f"is a .* option and this job runs {framework}") as caught:
        make_plan(resolve({}), options, PlatformSettings(), 0)
    assert caught.value.args[0] == flag or flag in str(caught.value)
