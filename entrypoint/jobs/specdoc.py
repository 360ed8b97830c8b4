"""Reading a job document for ``local --spec``: a CustomJob, a HyperparameterTuningJob, or a gcloud ``--config`` file.

The REST resources are proto JSON, which takes each field's camelCase name or its proto (snake_case) name
(https://protobuf.dev/programming-guides/json/). A gcloud ``--config`` file (a CustomJobSpec, or the tuning
job's fields, at the top) is read by gcloud in camelCase only: "Note that keys with underscore are invalid"
(https://cloud.google.com/sdk/gcloud/reference/ai/custom-jobs/create), so gcloud would see no worker pools in
a snake_case one; here it is refused. Unknown fields are refused as the API refuses them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.jobs import yamltext
from entrypoint.jobs.model import LUSTRE_FIELDS, NFS_FIELDS, JobSettings, JobSpec, PoolSpec

SOURCE = "--spec"
# The fields of each message (aiplatform v1), camelCase; tests/jobspecs check them against the SDK's types.
FIELDS = {
    "CustomJob": ("name", "displayName", "jobSpec", "state", "createTime", "startTime", "endTime", "updateTime",
                  "error", "labels", "encryptionSpec", "webAccessUris", "satisfiesPzs", "satisfiesPzi"),
    "HyperparameterTuningJob": ("name", "displayName", "studySpec", "maxTrialCount", "parallelTrialCount",
                                "maxFailedTrialCount", "trialJobSpec", "trials", "state", "createTime", "startTime",
                                "endTime", "updateTime", "error", "labels", "encryptionSpec", "satisfiesPzs",
                                "satisfiesPzi"),
    "CustomJobSpec": ("persistentResourceId", "workerPoolSpecs", "scheduling", "serviceAccount", "network",
                      "reservedIpRanges", "pscInterfaceConfig", "baseOutputDirectory", "protectedArtifactLocationId",
                      "tensorboard", "enableWebAccess", "enableDashboardAccess", "experiment", "experimentRun",
                      "models"),
    "WorkerPoolSpec": ("containerSpec", "pythonPackageSpec", "machineSpec", "replicaCount", "nfsMounts",
                       "lustreMounts", "diskSpec"),
    "MachineSpec": ("machineType", "acceleratorType", "acceleratorCount", "gpuPartitionSize", "tpuTopology",
                    "reservationAffinity"),
    "ContainerSpec": ("imageUri", "command", "args", "env"),
    "Scheduling": ("timeout", "restartJobOnWorkerRestart", "strategy", "disableRetries", "maxWaitDuration"),
}
_DURATION = re.compile(r"(\d+)(\.\d+)?s")


def snake(camel: str) -> str:
    """``workerPoolSpecs`` -> ``worker_pool_specs``."""
    return re.sub(r"([A-Z])", r"_\1", camel).lower()


@dataclass(frozen=True)
class Document:
    """A job document read apart: the CustomJob(Spec) it runs, and the tuning study if it is a tuning job."""

    job: JobSpec
    study: dict[str, Any] | None
    fields: tuple[str, ...]  # every field path present, for the line saying what is not emulated


class _Reader:
    """Field access by camelCase name, in camelCase only (gcloud) or either spelling (proto JSON)."""

    def __init__(self, camel_only: bool) -> None:
        self.camel_only = camel_only
        self.seen: list[str] = []

    def obj(self, value: Any, path: str, message: str | None = None) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(SOURCE, "must be an object", path)
        if message:
            known = FIELDS[message]
            allowed = set(known) if self.camel_only else set(known) | {snake(k) for k in known}
            unknown = sorted(k for k in value if k not in allowed)
            if unknown:
                what = (f"{unknown[0]} is not a field gcloud reads: a --config file takes camelCase keys only "
                        f"({re.sub(r'_([a-z])', lambda m: m[1].upper(), unknown[0])})"
                        if self.camel_only and "_" in unknown[0] else f"{unknown[0]} is not a field of {message}")
                raise ConfigError(SOURCE, what, path or "(document)")
        return value

    def get(self, obj: dict[str, Any], camel: str, path: str) -> Any:
        value = obj[camel] if camel in obj else obj.get(snake(camel))
        if value is not None and value != {} and value != []:
            self.seen.append(f"{path}.{camel}" if path else camel)
        return value


def _strings(value: Any, path: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(SOURCE, "must be a list of strings", path)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            hint = " (quote it in YAML)" if isinstance(item, int | float | bool) else ""
            raise ConfigError(SOURCE, f"must be a string, not {type(item).__name__}{hint}", f"{path}[{i}]")
    return tuple(value)


def count(value: Any, path: str, default: int) -> int:
    """An int field: a number, or a string of digits as proto JSON writes int64."""
    if value is None:
        return default
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.isdigit())):
        raise ConfigError(SOURCE, "must be a whole number", path)
    return int(value)


def _env(value: Any, path: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(SOURCE, "must be a list of {name, value}", path)
    for i, e in enumerate(value):
        if not (isinstance(e, dict) and isinstance(e.get("name"), str)):
            raise ConfigError(SOURCE, "must be {name, value}", f"{path}[{i}]")
    return tuple((e["name"], str(e.get("value", ""))) for e in value)


def _pool(r: _Reader, index: int, raw: dict[str, Any]) -> PoolSpec:
    path = f"workerPoolSpecs[{index}]"
    raw = r.obj(raw, path, "WorkerPoolSpec")
    machine = r.obj(r.get(raw, "machineSpec", path), f"{path}.machineSpec", "MachineSpec")
    kind = machine.get("acceleratorType", machine.get("accelerator_type"))
    accelerator = None
    if kind not in (None, "", "ACCELERATOR_TYPE_UNSPECIFIED"):
        acc_count = machine.get("acceleratorCount", machine.get("accelerator_count"))
        accelerator = (str(kind), count(acc_count, f"{path}.machineSpec.acceleratorCount", 1))
    for name in ("tpuTopology", "gpuPartitionSize"):
        r.get(machine, name, f"{path}.machineSpec")
    nfs, lustre = (_mounts(r.get(raw, name, path), f"{path}.{name}", fields)
                   for name, fields in (("nfsMounts", NFS_FIELDS), ("lustreMounts", LUSTRE_FIELDS)))
    disk = r.obj(r.get(raw, "diskSpec", path), f"{path}.diskSpec")
    affinity = r.obj(r.get(machine, "reservationAffinity", f"{path}.machineSpec"), f"{path}.machineSpec."
                     "reservationAffinity")
    container = r.get(raw, "containerSpec", path)
    if container is None:
        what = "runs a Python package (pythonPackageSpec)" if r.get(raw, "pythonPackageSpec", path) else \
            "has no containerSpec"
        raise ConfigError(SOURCE, f"{what}; local --spec runs containers of our images", path)
    container = r.obj(container, f"{path}.containerSpec", "ContainerSpec")
    image = container.get("imageUri", container.get("image_uri"))
    if not isinstance(image, str) or not image:
        raise ConfigError(SOURCE, "missing", f"{path}.containerSpec.imageUri")
    at = f"{path}.containerSpec"
    return PoolSpec(
        index=index, replicas=count(r.get(raw, "replicaCount", ""), f"{path}.replicaCount", 1),
        machine_type=str(machine.get("machineType", machine.get("machine_type")) or "unspecified"),
        image_uri=image, accelerator=accelerator,
        args=_strings(container.get("args"), f"{at}.args"), command=_strings(container.get("command"), f"{at}.command"),
        env=_env(container.get("env"), f"{at}.env"),
        disk_type=_field(disk, "bootDiskType") or None,
        disk_size_gb=count(_field(disk, "bootDiskSizeGb"), f"{path}.diskSpec.bootDiskSizeGb", 0) or None,
        reservation=_reservation(affinity, f"{path}.machineSpec.reservationAffinity"),
        nfs_mounts=tuple((m[0], m[1], m[2]) for m in nfs),
        lustre_mounts=tuple((m[0], m[1], m[2], m[3]) for m in lustre),
    )


def _mounts(value: Any, path: str, fields: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """nfsMounts / lustreMounts as tuples of their fields (a missing one empty; the API checks them)."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise ConfigError(SOURCE, "must be a list of objects", path)
    return tuple(tuple(str(_field(m, name) or "") for name in fields) for m in value)


def _field(obj: dict[str, Any], camel: str) -> Any:
    """A field in either spelling (a gcloud file was checked for camelCase already)."""
    return obj[camel] if camel in obj else obj.get(snake(camel))


def _reservation(affinity: dict[str, Any], path: str) -> tuple[str, tuple[str, ...]] | None:
    kind = _field(affinity, "reservationAffinityType")
    if not affinity or kind in (None, "TYPE_UNSPECIFIED"):
        return None
    return str(kind), _strings(_field(affinity, "values"), f"{path}.values")


def _seconds(value: Any, path: str) -> int | None:
    if value is None:
        return None
    match = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ConfigError(SOURCE, "must be a duration such as \"3600s\"", path)
    return int(match[1])


def _job_spec(r: _Reader, spec: dict[str, Any], name: str, resource: dict[str, Any]) -> JobSpec:
    raw_pools = r.get(spec, "workerPoolSpecs", "")
    if isinstance(raw_pools, dict):  # gcloud's own --config example has a single pool as a mapping
        raw_pools = [raw_pools]
    if not isinstance(raw_pools, list) or not raw_pools:
        raise ConfigError(SOURCE, "no workerPoolSpecs: expected a CustomJob, a HyperparameterTuningJob, or a gcloud "
                          "--config file (camelCase)", "workerPoolSpecs")
    pools = tuple(_pool(r, i, raw) if raw else None for i, raw in enumerate(raw_pools))
    scheduling = r.obj(r.get(spec, "scheduling", ""), "scheduling", "Scheduling")
    for key in ("timeout", "strategy", "maxWaitDuration"):
        r.get(scheduling, key, "scheduling")
    output = r.obj(r.get(spec, "baseOutputDirectory", ""), "baseOutputDirectory")
    for key in ("serviceAccount", "network", "reservedIpRanges", "tensorboard", "enableWebAccess",
                "persistentResourceId", "pscInterfaceConfig", "experiment", "experimentRun", "enableDashboardAccess",
                "models"):
        r.get(spec, key, "")
    for key in ("labels", "encryptionSpec"):
        r.get(resource, key, "")
    settings = JobSettings(
        restart_job_on_worker_restart=bool(r.get(scheduling, "restartJobOnWorkerRestart", "scheduling")),
        disable_retries=bool(r.get(scheduling, "disableRetries", "scheduling")),
        timeout_s=_seconds(scheduling.get("timeout"), "scheduling.timeout"),
        strategy=scheduling.get("strategy"),
    )
    prefix = output.get("outputUriPrefix", output.get("output_uri_prefix"))
    return JobSpec(name, pools, prefix, settings)


def job_from_document(doc: Any) -> Document:
    """A CustomJob (``jobSpec``), a HyperparameterTuningJob (``trialJobSpec``) or a gcloud --config file."""
    if not isinstance(doc, dict):
        raise ConfigError(SOURCE, "must be an object", "(document)")
    keys = set(doc)
    is_tuning = bool(keys & {"trialJobSpec", "trial_job_spec", "studySpec", "study_spec"})
    is_resource = bool(keys & {"jobSpec", "job_spec"}) or (is_tuning and bool(keys & {"displayName", "display_name"}))
    r = _Reader(camel_only=not is_resource)
    if r.camel_only:
        _camel_keys_only(doc, "")
    message = "HyperparameterTuningJob" if is_tuning else "CustomJob" if is_resource else "CustomJobSpec"
    doc = r.obj(doc, "", message)
    name = doc.get("displayName", doc.get("display_name"))
    display = str(name) if name else "spec"
    if is_tuning:
        study = r.obj(r.get(doc, "studySpec", ""), "studySpec")
        r.seen += [f"studySpec.{key}" for key in study if snake(key) not in ("metrics", "parameters")]
        spec = r.obj(r.get(doc, "trialJobSpec", ""), "trialJobSpec", "CustomJobSpec")
        job = _job_spec(r, spec, display, doc)
        return Document(job, {**study, "maxTrialCount": doc.get("maxTrialCount", doc.get("max_trial_count"))},
                        tuple(r.seen))
    spec = r.obj(r.get(doc, "jobSpec", ""), "jobSpec", "CustomJobSpec") if is_resource else doc
    return Document(_job_spec(r, spec, display, doc), None, tuple(r.seen))


def _camel_keys_only(value: Any, path: str) -> None:
    """gcloud's rule for --config files: a key with an underscore is not read (labels' keys aside)."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            _camel_keys_only(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            if "_" in key:
                camel = re.sub(r"_([a-z])", lambda m: m[1].upper(), key)
                raise ConfigError(SOURCE, f"{key}: gcloud's --config takes camelCase keys only (keys with "
                                  f"underscore are invalid, and gcloud would not read this one): use {camel}",
                                  path or "(document)")
            if key != "labels":
                _camel_keys_only(item, f"{path}.{key}" if path else key)


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
