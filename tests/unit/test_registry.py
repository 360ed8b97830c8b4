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

def test_the_local_supervisor_imports_no_framework(tmp_path: Path) -> None:
    """``local`` only starts and watches its replicas: a framework import there would cost every emulated job 1.5 s
    (torch) to 4.7 s (TensorFlow) of CPU for nothing. Its whole path here (two real replicas that fail at once on a
    bad option, the exit, the records and the closing lines), then what it imported."""
    probe = ("import sys; from entrypoint.cli import main\n"
             "try:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
             f"print(rc, [m for m in {(*HEAVY, 'numpy')!r} if m in sys.modules])")
    args = ["local", "--workers", "2", "--output-dir", str(tmp_path), "--", "run", "--framework", "pytorch",
            "--timeout", "inf"]
    out = subprocess.run([PYTHON, "-c", probe, *args], env=subprocess_env(), capture_output=True, text=True,
                         timeout=120)
    assert "starting 2 replicas" in out.stdout and "--timeout: must be a finite number" in out.stderr, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "2 []", out.stdout[-2000:]


TOY_FRAMEWORK = '''
    """A toy framework: one process per node that writes where it was placed."""
    from entrypoint.errors import ConfigError
    from entrypoint.options import positive_int
    from entrypoint.planning.registry import Flag, Framework, NodePlan


    def plan(topo, options, user_set, gpus, outputs):
        level = options.framework_option("toy_level", 1)
        if level > 5 and topo.num_nodes > 1:
            raise ConfigError("--toy-level", "at most 5 across nodes")
        return NodePlan(strategy=options.strategy or "toy", reason="a toy", nproc_per_node=1,
                        env={"TOY_LEVEL": str(level)})


    FRAMEWORK = Framework(name="toy", probe="json", strategies=("toy",), plan=plan,
                          launcher="toyfw.launch:launch", worker="toyfw.worker:run",
                          flags=(Flag("--toy-level", "how toy", positive_int),),
                          image="toy", kubeflow_kinds=("pytorchjob",),
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
        Path(plan.outputs.job_dir, f"toy-{ctx.replica}.json").write_text(json.dumps(out))
        return 0
'''
# The one registry line, in every process of a test (local's replicas are processes of their own).
TOY_REGISTRY_LINE = "from entrypoint.planning import registry\nregistry.REGISTRY['toy'] = 'toyfw.framework'\n"


@pytest.fixture
def toy(tmp_path: Path) -> dict[str, str]:
    """The toy framework's package on PYTHONPATH and its registry line (a sitecustomize there); the environment."""
    package = tmp_path / "toyfw"
    package.mkdir()
    for name, text in {"__init__": "", "framework": TOY_FRAMEWORK, "launch": TOY_LAUNCH, "worker": TOY_WORKER,
                       "errors": "class ToyPeerLost(Exception):\n    pass\n"}.items():
        (package / f"{name}.py").write_text(textwrap.dedent(text))
    (tmp_path / "sitecustomize.py").write_text(TOY_REGISTRY_LINE)
    (tmp_path / "user_module.py").write_text("")
    return subprocess_env({"PYTHONPATH": f"{tmp_path}:{subprocess_env()['PYTHONPATH']}"})


def _entrypoint(env: dict[str, str], cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "entrypoint", *argv], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=180)


def test_a_toy_framework_is_its_package_plus_one_registry_line(tmp_path: Path, toy: dict[str, str]) -> None:
    job = tmp_path / "job"
    run = _entrypoint(toy, tmp_path, "run", "--framework", "toy", "--module", "user_module", "--toy-level", "3",
                      "--job-dir", str(job))
    assert run.returncode == 0, run.stderr
    assert json.loads((job / "toy-node-0.json").read_text()) == {
        "rank": 0, "world_size": 1, "chief": True, "level": "3", "failure_rank": 0, "replica": "node-0"}
    helped = _entrypoint(toy, tmp_path, "run", "--help")
    assert "--toy-level" in helped.stdout and "toy" in helped.stdout
    lost = _entrypoint(toy, tmp_path, "run", "--framework", "toy", "--module", "user_module", "--toy-level", "9",
                       "--job-dir", str(job))
    assert lost.returncode == 129, lost.stderr  # its own lost peer: retryable, as the framework declared
    assert "error: peer_lost on node-0" in lost.stderr.splitlines()[-1] and "ToyPeerLost" in lost.stderr


def test_the_toy_framework_is_described_and_checked(tmp_path: Path, toy: dict[str, str]) -> None:
    """describe and doctor know it from its record alone: no DataLoader workers, its plan's variables."""
    described = _entrypoint(toy, tmp_path, "describe", "--framework", "toy", "--module", "user_module",
                            "--toy-level", "4")
    assert described.returncode == 0, described.stderr
    plan = json.loads(described.stdout)
    assert (plan["plan"]["framework"], plan["plan"]["strategy"], plan["env"]["TOY_LEVEL"]) == ("toy", "toy", "4")
    doctor = _entrypoint(toy, tmp_path, "doctor", "--framework", "toy", "--module", "user_module", "--job-dir",
                         str(tmp_path / "job"), "--json")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    checks = {c["check"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["shm"]["status"] == "ok" and "0 DataLoader workers" in checks["shm"]["message"]


@pytest.mark.slow
def test_the_toy_framework_runs_under_local(tmp_path: Path, toy: dict[str, str]) -> None:
    """Two emulated Vertex AI replicas of the toy framework: a chief and a worker, one world."""
    out = tmp_path / "out"
    local = _entrypoint(toy, tmp_path, "local", "--workers", "2", "--output-dir", str(out), "--", "run",
                        "--framework", "toy", "--module", "user_module", "--timeout", "60")
    assert local.returncode == 0, local.stdout + local.stderr
    facts = {p.name: json.loads(p.read_text()) for p in out.rglob("toy-*.json")}
    assert sorted((f["rank"], f["world_size"], f["chief"]) for f in facts.values()) == [(0, 2, True), (1, 2, False)]


def test_job_specs_for_the_toy_frameworks_image(tmp_path: Path, toy: dict[str, str]) -> None:
    """job vertex / kubeflow infer it from its image name and ask its own planner; its roles and kinds apply."""
    image = "us-central1-docker.pkg.dev/p/trainers/toy:v1"
    vertex = _entrypoint(toy, tmp_path, "job", "vertex", "--image", image, "--workers", "2", "--",
                         "--module", "user_module", "--toy-level", "5")
    assert vertex.returncode == 0, vertex.stderr
    pools = json.loads(vertex.stdout)["jobSpec"]["workerPoolSpecs"]
    assert [p["containerSpec"]["args"] for p in pools] == [["--module", "user_module", "--toy-level", "5"]] * 2
    refused = _entrypoint(toy, tmp_path, "job", "vertex", "--image", image, "--workers", "2", "--",
                          "--module", "user_module", "--toy-level", "9")
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "entrypoint: error: job vertex: workerpool0 (the chief) at run time: --toy-level: at most 5 across nodes")
    evaluators = _entrypoint(toy, tmp_path, "job", "vertex", "--image", image, "--evaluators", "1", "--",
                             "--module", "user_module")
    assert "evaluators are TensorFlow only, not toy" in evaluators.stderr and evaluators.returncode == 2
    kubeflow = _entrypoint(toy, tmp_path, "job", "kubeflow", "--kind", "pytorchjob", "--image", image, "--workers",
                           "2", "--", "--module", "user_module")
    assert kubeflow.returncode == 0 and "kind: PyTorchJob" in kubeflow.stdout.replace('"', "")
    tfjob = _entrypoint(toy, tmp_path, "job", "kubeflow", "--kind", "tfjob", "--image", image, "--",
                        "--module", "user_module")
    assert "a TFJob does not run toy; use --kind pytorchjob" in tfjob.stderr and tfjob.returncode == 2


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
