"""``local --spec FILE``: a CustomJob, CustomJobSpec or gcloud ``--config`` file as emulated pools.

JSON or YAML, camelCase (REST, gcloud) or snake_case (the Python client) keys. Every pool on our
image becomes local processes running ``run <containerSpec.args>`` (the image's ENTRYPOINT); a pool
on Google's Reduction Server image is listed in CLUSTER_SPEC but not started.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from entrypoint.emulator import Pool
from entrypoint.errors import ConfigError
from entrypoint.jobs import machines, yamltext
from entrypoint.jobs.model import JobSpec, PoolSpec
from entrypoint.jobs.rules import infer_framework, run_options, validate

SOURCE = "--spec"


def _field(obj: dict[str, Any], camel: str) -> Any:
    """``obj[camel]``, or its snake_case spelling."""
    if camel in obj:
        return obj[camel]
    return obj.get(re.sub(r"([A-Z])", r"_\1", camel).lower())


def _object(value: Any, path: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(SOURCE, "must be an object", path)
    return value


def _strings(value: Any, path: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(SOURCE, "must be a list of strings", path)
    return tuple(value)


def _count(value: Any, path: str, default: int) -> int:
    """An int64 field: a number, or a string of digits as proto JSON writes it."""
    if value is None:
        return default
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.isdigit())):
        raise ConfigError(SOURCE, "must be a whole number", path)
    return int(value)


def _env(value: Any, path: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(e, dict) and isinstance(e.get("name"), str)
                                              for e in value):
        raise ConfigError(SOURCE, "must be a list of {name, value}", path)
    return tuple((e["name"], str(e.get("value", ""))) for e in value)


def _pool(index: int, raw: dict[str, Any]) -> PoolSpec:
    path = f"workerPoolSpecs[{index}]"
    machine = _object(_field(raw, "machineSpec"), f"{path}.machineSpec")
    kind = _field(machine, "acceleratorType")
    accelerator = None
    if kind not in (None, "", "ACCELERATOR_TYPE_UNSPECIFIED"):
        count = _count(_field(machine, "acceleratorCount"), f"{path}.machineSpec.acceleratorCount", 1)
        accelerator = (str(kind), count)
    container = _field(raw, "containerSpec")
    if container is None:
        package = _field(raw, "pythonPackageSpec")
        what = "runs a Python package (pythonPackageSpec)" if package else "has no containerSpec"
        raise ConfigError(SOURCE, f"{what}; local --spec runs containers of our images", path)
    container = _object(container, f"{path}.containerSpec")
    image = _field(container, "imageUri")
    if not isinstance(image, str) or not image:
        raise ConfigError(SOURCE, "missing", f"{path}.containerSpec.imageUri")
    return PoolSpec(
        index=index,
        replicas=_count(_field(raw, "replicaCount"), f"{path}.replicaCount", 1),
        machine_type=str(_field(machine, "machineType") or "unspecified"),
        image_uri=image,
        accelerator=accelerator,
        args=_strings(_field(container, "args"), f"{path}.containerSpec.args"),
        command=_strings(_field(container, "command"), f"{path}.containerSpec.command"),
        env=_env(_field(container, "env"), f"{path}.containerSpec.env"),
    )


def job_from_document(doc: Any) -> JobSpec:
    """A CustomJob (``jobSpec``), a CustomJobSpec or a gcloud config (``workerPoolSpecs`` at the top)."""
    doc = _object(doc, "(document)")
    spec = _field(doc, "jobSpec")
    spec = _object(spec, "jobSpec") if spec is not None else doc
    raw_pools = _field(spec, "workerPoolSpecs")
    if isinstance(raw_pools, dict):  # gcloud's own --config example has a single pool as a mapping
        raw_pools = [raw_pools]
    if not isinstance(raw_pools, list) or not raw_pools:
        raise ConfigError(SOURCE, "no workerPoolSpecs: expected a CustomJob, a CustomJobSpec or a gcloud "
                          "--config file", "workerPoolSpecs")
    pools = tuple(_pool(i, _object(raw, f"workerPoolSpecs[{i}]")) if raw else None
                  for i, raw in enumerate(raw_pools))
    output = _object(_field(spec, "baseOutputDirectory"), "baseOutputDirectory")
    name = _field(doc, "displayName")
    return JobSpec(str(name) if name else "spec", pools, _field(output, "outputUriPrefix"))


def read_document(path: str) -> Any:
    """Parse FILE as JSON, else as YAML (PyYAML)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(SOURCE, f"cannot read {path}: {type(exc).__name__}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return yamltext.load(text, SOURCE)


def _replica_command(pool: PoolSpec) -> tuple[str, ...]:
    """What the image would run: its ENTRYPOINT (``python -m entrypoint run``) + the args."""
    if pool.command and " ".join(pool.command[-3:]) not in ("-m entrypoint run", "trainer-entrypoint run"):
        raise ConfigError(SOURCE, "replaces the image's ENTRYPOINT; local --spec runs `entrypoint run ARGS` only",
                          f"workerPoolSpecs[{pool.index}].containerSpec.command")
    return ("run", *pool.args)


def to_pools(job: JobSpec) -> list[Pool]:
    """The emulator's pools: those on the chief's image (ours) started, the others only listed."""
    ours = job.pools[0].image_uri if job.pools[0] else ""
    pools = []
    for spec in job.present():
        if spec.image_uri == ours:
            pools.append(Pool(spec.name, spec.replicas, _replica_command(spec), env=spec.env))
        elif spec.index == 1:
            raise ConfigError(SOURCE, "the workers run another image than the chief; local --spec runs the "
                              "chief's image (ours) only", "workerPoolSpecs[1].containerSpec.imageUri")
        elif machines.is_reduction_server(spec.image_uri):
            pools.append(Pool(spec.name, spec.replicas, start=False,
                              note="Google's Reduction Server image, not ours (reducers are not part of the world)"))
        else:
            pools.append(Pool(spec.name, spec.replicas, start=False, note="another image than the chief's (ours)"))
    return pools


def spec_pools(path: str) -> list[Pool]:
    """Read, check and report the job in FILE; return the pools to emulate."""
    job = job_from_document(read_document(path))
    chief = job.pool(0)
    if chief is None:
        raise ConfigError(SOURCE, "workerPoolSpecs[0] (the chief) is empty: every job has one primary replica")
    options = run_options(chief.args, SOURCE)
    framework = infer_framework(None, chief.image_uri, options.framework)
    for warning in validate(job, SOURCE, framework, options.strategy):
        print(f"entrypoint: warning: {warning}", file=sys.stderr, flush=True)
    for spec in job.present():
        print(f"[local] {spec.name}: {spec.replicas} x {spec.machine_text()} (machine and accelerators are not "
              f"emulated here), image {spec.image_uri}", flush=True)
    if job.base_output_dir:
        print(f"[local] baseOutputDirectory {job.base_output_dir} is Vertex's; outputs go under --output-dir",
              flush=True)
    return to_pools(job)
