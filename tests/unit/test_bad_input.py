"""Bad input: a one-line ConfigError naming the variable and the JSON path, never the whole value."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from entrypoint.cluster import envvars
from entrypoint.cluster.environments import resolve
from entrypoint.cluster.topology import ClusterTopology
from entrypoint.errors import ConfigError
from tests.conftest import PYTHON, ROOT, subprocess_env

SECRET = "hunter2-secret-token"
JOB = {"args": [f"--password={SECRET}"]}


def spec(cluster: object, task: object) -> str:
    return json.dumps({"cluster": cluster, "task": task, "job": JOB})


GOOD_CLUSTER = {"workerpool0": ["c:2222"], "workerpool1": ["w0:2222", "w1:2222"]}
BAD: list[tuple[str, dict[str, str], str, str]] = [
    ("malformed json", {"CLUSTER_SPEC": '{"cluster": {"workerpool0": ["c:1"]'}, "CLUSTER_SPEC", "not valid JSON"),
    ("not an object", {"CLUSTER_SPEC": "[1, 2]"}, "CLUSTER_SPEC", "JSON object"),
    ("missing task", {"CLUSTER_SPEC": json.dumps({"cluster": GOOD_CLUSTER, "job": JOB})}, "CLUSTER_SPEC: task",
     "missing"),
    ("missing cluster", {"CLUSTER_SPEC": json.dumps({"task": {"type": "workerpool0"}, "job": JOB})},
     "CLUSTER_SPEC: cluster", "missing"),
    ("unknown task type", {"CLUSTER_SPEC": spec(GOOD_CLUSTER, {"type": "workerpool9", "index": 0})},
     "CLUSTER_SPEC: task.type", "unknown task type"),
    ("index out of range", {"CLUSTER_SPEC": spec(GOOD_CLUSTER, {"type": "workerpool1", "index": 2})},
     "CLUSTER_SPEC: task.index", "out of range"),
    ("negative index", {"CLUSTER_SPEC": spec(GOOD_CLUSTER, {"type": "workerpool1", "index": -1})},
     "CLUSTER_SPEC: task.index", "non-negative"),
    ("two chiefs in workerpool0", {"CLUSTER_SPEC": spec({"workerpool0": ["a:1", "b:1"]}, {"type": "workerpool0"})},
     "CLUSTER_SPEC: cluster.workerpool0", "two chiefs"),
    ("chief and master", {"TF_CONFIG": json.dumps({"cluster": {"chief": ["a:1"], "master": ["b:1"]},
                                                   "task": {"type": "chief", "index": 0}})},
     "TF_CONFIG: cluster.master", "two chiefs"),
    ("no workerpool0", {"CLUSTER_SPEC": spec({"workerpool1": ["w:1"]}, {"type": "workerpool1"})},
     "CLUSTER_SPEC: cluster.workerpool0", "missing"),
    ("bad address", {"CLUSTER_SPEC": spec({"workerpool0": ["nohost"]}, {"type": "workerpool0"})},
     "CLUSTER_SPEC: cluster.workerpool0[0]", "host:port"),
    ("RANK without MASTER_ADDR", {"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "MASTER_ADDR", "missing"),
    ("RANK alone", {"RANK": "1"}, "MASTER_ADDR", "missing"),
    ("WORLD_SIZE > 1 alone", {"WORLD_SIZE": "4"}, "RANK", "missing"),
    ("RANK out of range", {"RANK": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "m", "MASTER_PORT": "1"}, "RANK",
     "out of range"),
    ("RANK not a number", {"RANK": "one", "WORLD_SIZE": "2", "MASTER_ADDR": "m", "MASTER_PORT": "1"}, "RANK",
     "integer"),
    ("torchrun without RANK", {"LOCAL_RANK": "0", "WORLD_SIZE": "2"}, "RANK", "missing"),
    ("mpi without size", {"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE", "missing"),
    ("elastic PET_NNODES", {"PET_NNODES": "1:4"}, "PET_NNODES", "elastic"),
    ("JAX_PROCESS_ID alone", {"JAX_PROCESS_ID": "1"}, "JAX_NUM_PROCESSES", "missing"),
    ("JAX_PROCESS_ID out of range", {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2",
                                     "JAX_COORDINATOR_ADDRESS": "c:1"}, "JAX_PROCESS_ID", "out of range"),
    ("several jax processes, no id", {"JAX_NUM_PROCESSES": "2", "JAX_COORDINATOR_ADDRESS": "c:1"}, "JAX_PROCESS_ID",
     "missing"),
    ("several jax processes, no coordinator", {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"},
     "JAX_COORDINATOR_ADDRESS", "missing"),
    ("jax coordinator without a port", {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1",
                                        "JAX_COORDINATOR_ADDRESS": "coord"}, "JAX_COORDINATOR_PORT", "missing"),
    ("jax coordinator port out of range", {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0",
                                           "JAX_COORDINATOR_ADDRESS": "c:70000"}, "JAX_COORDINATOR_ADDRESS",
     "invalid port"),
]


@pytest.mark.parametrize(("env", "where", "what"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_one_clear_config_error(env: dict[str, str], where: str, what: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(env)
    message = str(info.value)
    assert message.startswith(where + ":"), message
    assert what in message
    assert "\n" not in message
    assert SECRET not in message and "--password" not in message


@pytest.mark.parametrize("case", ["malformed json", "index out of range", "two chiefs in workerpool0",
                                  "RANK without MASTER_ADDR", "WORLD_SIZE > 1 alone"])
def test_cli_exits_2_with_one_line_and_no_traceback(case: str) -> None:
    env = next(b[1] for b in BAD if b[0] == case)
    proc = subprocess.run([PYTHON, "-m", "entrypoint", "describe", "--framework", "pytorch"], cwd=ROOT,
                          env=subprocess_env(env), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("entrypoint: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and SECRET not in proc.stderr


CANARY = "canary-value-8f7e"
ECHOES = [
    ("task.type", spec(GOOD_CLUSTER, {"type": CANARY, "index": 0})),
    ("task.type", spec(GOOD_CLUSTER, {"type": 17, "index": 0})),
    ("task.index", spec(GOOD_CLUSTER, {"type": "workerpool1", "index": CANARY})),
    ("task.index", spec(GOOD_CLUSTER, {"type": "workerpool1", "index": 31337})),
    ("cluster.workerpool1[1]", spec({**GOOD_CLUSTER, "workerpool1": ["w0:2222", CANARY]}, {"type": "workerpool0"})),
    ("cluster.workerpool1[0]", spec({**GOOD_CLUSTER, "workerpool1": [f"{CANARY}:99999"]}, {"type": "workerpool0"})),
    ("cluster", spec({**GOOD_CLUSTER, CANARY: ["x:1"]}, {"type": "workerpool0"})),
    ("task.trial", spec(GOOD_CLUSTER, {"type": "workerpool0", "trial": {"x": CANARY}})),
]


@pytest.mark.parametrize(("path", "value"), ECHOES)
def test_config_errors_name_the_variable_and_path_never_the_value(path: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve({"CLUSTER_SPEC": value})
    message = str(info.value)
    assert message.startswith(f"CLUSTER_SPEC: {path}:"), message
    assert CANARY not in message and "31337" not in message and "99999" not in message


def test_run_with_a_bad_spec_prints_and_records_no_value(tmp_path: Path) -> None:
    """``run`` (which writes failure records) with a task.type carrying a canary: nowhere to be read."""
    env = {"CLUSTER_SPEC": spec(GOOD_CLUSTER, {"type": CANARY, "index": 0}), "TRAINER_JOB_DIR": str(tmp_path)}
    proc = subprocess.run([PYTHON, "-m", "entrypoint", "run", "--framework", "pytorch", "--module",
                           "trainers.digits_torch"], cwd=ROOT, env=subprocess_env(env), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "CLUSTER_SPEC: task.type" in proc.stderr
    assert CANARY not in proc.stdout + proc.stderr
    records = list(tmp_path.rglob("*.json"))
    assert records and all(CANARY not in r.read_text() for r in records)


# ---- fuzzing: no input produces anything but a topology or a ConfigError --------------------------
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12)
json_values = st.recursive(json_scalars, lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=20)
pool_names = st.sampled_from(["workerpool0", "workerpool1", "workerpool2", "workerpool3", "master", "chief",
                              "worker", "ps", "evaluator", "other"])
addresses = st.lists(st.one_of(st.from_regex(r"[a-z0-9.-]{1,8}:[0-9]{1,6}", fullmatch=True), json_scalars),
                     max_size=4)
tasks = st.fixed_dictionaries({}, optional={"type": st.one_of(pool_names, json_scalars),
                                            "index": st.one_of(st.integers(-2, 5), json_scalars),
                                            "trial": st.one_of(st.text(max_size=70), json_scalars)})
specs = st.fixed_dictionaries({}, optional={"cluster": st.one_of(st.dictionaries(pool_names, addresses, max_size=5),
                                                                  json_values),
                                            "task": st.one_of(tasks, json_values), "job": json_values})
int_text = st.one_of(st.integers(-3, 20).map(str), st.text(max_size=6))


def _format_variables() -> tuple[list[str], list[str]]:
    """What the fuzzers feed: every envvars.py name a cluster format (entrypoint/cluster/environments/, but not the
    platform settings) reads as ``ev.NAME``, split into the JSON specs (given to ``load_object``) and the rest.
    A new format's variables are fuzzed as soon as it reads them from envvars.py."""
    json_specs: set[str] = set()
    read: set[str] = set()
    for module in (ROOT / "entrypoint" / "cluster" / "environments").glob("*.py"):
        if module.name == "settings.py":
            continue
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ev":
                read.add(getattr(envvars, node.attr))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "load_object":
                json_specs |= {getattr(envvars, a.attr) for a in node.args[:1] if isinstance(a, ast.Attribute)}
    return sorted(json_specs), sorted(read - json_specs)


JSON_VARIABLES, OTHER_VARIABLES = _format_variables()


def test_the_fuzzers_cover_the_variables_of_every_format() -> None:
    assert JSON_VARIABLES == ["CLUSTER_SPEC", "TF_CONFIG"]
    assert {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_CROSS_RANK", "PMI_RANK", "PMI_SIZE",
            "CLOUD_ML_TRIAL_ID", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_COORDINATOR_ADDRESS",
            "JAX_COORDINATOR_PORT"} <= set(OTHER_VARIABLES)


def _check(env: dict[str, str]) -> None:
    try:
        topo = resolve(env)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(topo, ClusterTopology)
    topo.tf_config_json()
    topo.torch_env()
    topo.describe()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variable=st.sampled_from(JSON_VARIABLES), value=st.one_of(specs.map(json.dumps),
                                                                                 json_values.map(json.dumps),
                                                                                 st.text(max_size=40)))
def test_fuzz_json_specs(variable: str, value: str) -> None:
    _check({variable: value})


@settings(max_examples=300, deadline=None)
@given(env=st.dictionaries(st.sampled_from(OTHER_VARIABLES), int_text, max_size=6))
def test_fuzz_integer_variables(env: dict[str, str]) -> None:
    _check(env)


@pytest.mark.parametrize(("flag", "value"), [("--timeout", "inf"), ("--timeout", "nan"), ("--timeout", "-1"),
                                             ("--grace-period", "inf"), ("--hang-timeout", "inf"),
                                             ("--hang-timeout=-inf", None), ("--startup-timeout", "nan")])
def test_a_deadline_must_be_a_finite_number(flag: str, value: str | None) -> None:
    """``--timeout inf`` is no deadline at all (and failed later as the user's OverflowError): a config error."""
    from entrypoint.planning.runargs import parse_options

    with pytest.raises(ConfigError, match=rf"{flag.split('=')[0]}: .*finite number") as caught:
        parse_options("run", [flag] if value is None else [flag, value])
    assert caught.value.failure.exit_code == 2
