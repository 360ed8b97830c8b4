"""``--format python``: a script that submits the job with google-cloud-aiplatform (its own classes and arguments)."""

from __future__ import annotations

import json
import pprint
import re
from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.jobs.model import JobSettings, JobSpec
from entrypoint.jobs.vertex.tuning import Study

_STRATEGY = "aiplatform.compat.types.custom_job.Scheduling.Strategy."
_SCALES = {"UNIT_LINEAR_SCALE": "linear", "UNIT_LOG_SCALE": "log", "UNIT_REVERSE_LOG_SCALE": "reverse_log"}
_ALGORITHMS = {"GRID_SEARCH": "grid", "RANDOM_SEARCH": "random"}
_MEASUREMENTS = {"LAST_MEASUREMENT": "last", "BEST_MEASUREMENT": "best"}


def _snake(value: Any) -> Any:
    """REST camelCase keys as the Python client's snake_case ones."""
    if isinstance(value, dict):
        return {re.sub(r"(?<!^)([A-Z])", r"_\1", k).lower(): _snake(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_snake(v) for v in value]
    return value


def _literal(value: Any, indent: int = 0) -> str:
    """A Python literal of dicts, lists, strings, numbers and booleans, continuation lines indented."""
    return pprint.pformat(value, indent=1, width=110 - indent, sort_dicts=False).replace("\n", "\n" + " " * indent)


def _job_arguments(job: JobSpec) -> list[str]:
    s = job.settings
    out = [f"display_name={json.dumps(job.display_name, ensure_ascii=False)},",
           "worker_pool_specs=worker_pool_specs,"]
    if job.base_output_dir:
        out.append(f"base_output_dir={json.dumps(job.base_output_dir, ensure_ascii=False)},")
    if s.labels:
        out.append(f"labels={_literal(dict(s.labels), 4)},")
    if s.kms_key:
        out.append(f"encryption_spec_key_name={json.dumps(s.kms_key)},")
    if s.persistent_resource_id:
        out.append(f"persistent_resource_id={json.dumps(s.persistent_resource_id)},")
    return out


def _run_arguments(s: JobSettings) -> list[str]:
    """Keyword arguments of CustomJob.submit / HyperparameterTuningJob.run for the settings."""
    if s.reserved_ip_ranges:
        raise ConfigError("--format python", "the SDK's submit() has no reserved IP ranges; use --format json or "
                          "gcloud-config")
    items: list[tuple[str, Any]] = [
        ("service_account", s.service_account), ("network", s.network), ("timeout", s.timeout_s),
        ("restart_job_on_worker_restart", s.restart_job_on_worker_restart or None),
        ("enable_web_access", s.enable_web_access or None), ("tensorboard", s.tensorboard),
        ("disable_retries", s.disable_retries or None), ("max_wait_duration", s.max_wait_s),
    ]
    out = [f"{k}={_literal(v)}," for k, v in items if v is not None]
    if s.strategy:
        out.append(f"scheduling_strategy={_STRATEGY}{s.strategy},")
    return out


def _init(job: JobSpec, region: str, project: str | None) -> list[str]:
    if job.base_output_dir:
        bucket = "gs://" + job.base_output_dir[len("gs://"):].split("/", 1)[0]
        staging = f"staging_bucket={json.dumps(bucket)},"
    else:  # CustomJob() insists on one, only to make up a base output directory, which the script takes out again
        staging = 'staging_bucket="gs://YOUR_BUCKET",  # unused: no --base-output-dir, see below'
    init = [f"project={json.dumps(project)},"] if project else []
    init += [f"location={json.dumps(region)},", staging]
    return ["from google.cloud import aiplatform", "", "aiplatform.init(", *(f"    {a}" for a in init), ")", "",
            f"worker_pool_specs = {_literal(_snake(job.rest_pools()))}", ""]


def _job_spec_lines(name: str, job: JobSpec, experiment: bool) -> list[str]:
    """Fields the SDK's constructor and submit() take no argument for, set on the job's spec before it is sent."""
    s = job.settings
    lines = []
    if not job.base_output_dir:
        lines.append(f"del {name}.job_spec.base_output_directory  # no --base-output-dir: none, as in the json and "
                     "gcloud formats (the SDK made one up under the staging bucket)")
    if s.psc_network_attachment:
        lines.append(f"{name}.job_spec.psc_interface_config = {_literal(_snake(s.rest_psc()), 4)}")
    if s.enable_dashboard_access:
        lines.append(f"{name}.job_spec.enable_dashboard_access = True")
    if experiment and s.experiment:
        lines.append(f"{name}.job_spec.experiment = {json.dumps(s.experiment)}")
        if s.experiment_run:
            lines.append(f"{name}.job_spec.experiment_run = {json.dumps(s.experiment_run)}")
    return lines


def _experiment_arguments(s: JobSettings) -> list[str]:
    """submit(experiment=, experiment_run=): the SDK looks both up and sets their names (it resets any other)."""
    if not s.experiment:
        return []
    experiment = s.experiment.rsplit("/", 1)[1]
    out = [f"experiment={json.dumps(experiment)},"]
    if s.experiment_run:
        out.append(f"experiment_run={json.dumps(s.experiment_run.rsplit('/', 1)[1][len(experiment) + 1:])},")
    return out


def render_python(job: JobSpec, region: str, project: str | None) -> str:
    """A script that submits the CustomJob (``pip install google-cloud-aiplatform``)."""
    run = _run_arguments(job.settings) + _experiment_arguments(job.settings)
    lines = [
        '"""Submit a Vertex AI CustomJob (written by `python -m entrypoint job vertex --format python`)."""',
        *_init(job, region, project),
        "job = aiplatform.CustomJob(",
        *(f"    {a}" for a in _job_arguments(job)),
        ")",
        *_job_spec_lines("job", job, experiment=False),
        "job.submit(" if run else "job.submit()  # returns once the job is created; job.run() waits for it",
        *([*(f"    {a}" for a in run), ")  # returns once the job is created; job.run() waits for it"] if run else []),
    ]
    return "\n".join(lines) + "\n"


def _parameter_spec(parameter: dict[str, Any], parent_values: list[Any] | None = None, indent: int = 8) -> str:
    """The SDK's spec for a ParameterSpec (REST), its conditional parameters nested under it."""
    scale = _SCALES.get(parameter.get("scaleType", ""), "linear")
    if "doubleValueSpec" in parameter:
        v = parameter["doubleValueSpec"]
        head = f"hpt.DoubleParameterSpec(min={v['minValue']!r}, max={v['maxValue']!r}, scale={scale!r}"
    elif "integerValueSpec" in parameter:
        v = parameter["integerValueSpec"]
        head = f"hpt.IntegerParameterSpec(min={int(v['minValue'])}, max={int(v['maxValue'])}, scale={scale!r}"
    elif "categoricalValueSpec" in parameter:
        head = f"hpt.CategoricalParameterSpec(values={parameter['categoricalValueSpec']['values']!r}"
    else:
        head = f"hpt.DiscreteParameterSpec(values={parameter['discreteValueSpec']['values']!r}, scale={scale!r}"
    if parent_values is not None:
        head += f", parent_values={parent_values!r}"
    children = parameter.get("conditionalParameterSpecs", [])
    if not children:
        return head + ")"
    pad = " " * (indent + 4)
    nested = []
    for cond in children:
        (condition,) = [v for k, v in cond.items() if k.startswith("parent")]
        values = [int(x) for x in condition["values"]] if "parentIntValues" in cond else condition["values"]
        child = cond["parameterSpec"]
        nested.append(f"{pad}{child['parameterId']!r}: {_parameter_spec(child, values, indent + 4)},")
    return head + ", conditional_parameter_spec={\n" + "\n".join(nested) + f"\n{' ' * indent}}})"


def render_python_tuning(job: JobSpec, study: Study, region: str, project: str | None) -> str:
    """A script that creates the HyperparameterTuningJob and returns once it exists."""
    if study.stopping is not None:
        raise ConfigError("--format python", "the SDK's HyperparameterTuningJob takes no early stopping rule; use "
                          "--format json or gcloud-config")
    fields = study.rest_fields()
    params = ",\n".join(f"        {p['parameterId']!r}: {_parameter_spec(p)}"
                         for p in fields["studySpec"]["parameters"])
    metrics = ", ".join(f"{m!r}: {g.lower()!r}" for m, g in study.metrics)
    algorithm = _ALGORITHMS.get(study.algorithm)
    tuning = [
        f"display_name={json.dumps(job.display_name, ensure_ascii=False)},",
        "custom_job=trial_job,",
        f"metric_spec={{{metrics}}},",
        f"parameter_spec={{\n{params},\n    }},",
        f"max_trial_count={study.max_trials},", f"parallel_trial_count={study.parallel_trials},",
        f"max_failed_trial_count={study.max_failed_trials},",
        *([f"search_algorithm={algorithm!r},"] if algorithm else []),
        f"measurement_selection={_MEASUREMENTS[study.measurement]!r},  # the SDK's default is 'best'",
        *(a for a in _job_arguments(job)[2:] if a.startswith(("labels=", "encryption_spec_key_name="))),
    ]
    trial = [a for a in _job_arguments(job) if not a.startswith(("labels=", "encryption_spec_key_name="))]
    lines = [
        '"""Create a Vertex AI HyperparameterTuningJob (written by `python -m entrypoint job vertex-tuning`)."""',
        *_init(job, region, project)[:1],
        "from google.cloud.aiplatform import hyperparameter_tuning as hpt",
        *_init(job, region, project)[1:],
        "trial_job = aiplatform.CustomJob(",
        *(f"    {a}" for a in trial),
        ")",
        *_job_spec_lines("trial_job", job, experiment=True),
        "job = aiplatform.HyperparameterTuningJob(",
        *(f"    {a}" for a in tuning),
        ")",
        "job.run(",
        *(f"    {a}" for a in _run_arguments(job.settings)),
        "    sync=False,",
        ")",
        "job.wait_for_resource_creation()  # returns once the job exists; the trials run on Vertex AI",
    ]
    return "\n".join(lines) + "\n"
