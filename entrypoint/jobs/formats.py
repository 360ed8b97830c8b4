"""The four ways ``job vertex`` writes a job: REST JSON, gcloud --config YAML, a gcloud command, Python."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.jobs import machines, yamltext
from entrypoint.jobs.model import JobSpec, PoolSpec

FORMATS = ("json", "gcloud-config", "gcloud-command", "python")
# gcloud list flags split on commas; `gcloud topic escaping`: ^D^ first picks another delimiter D.
_DELIMITERS = "|;:@#~!%+"


def render_json(job: JobSpec) -> str:
    """The CustomJob as ``projects.locations.customJobs.create`` takes it (camelCase)."""
    return json.dumps(job.rest_custom_job(), indent=2, ensure_ascii=False) + "\n"


def render_gcloud_config(job: JobSpec, region: str) -> str:
    """The CustomJobSpec YAML for ``gcloud ai custom-jobs create --config``."""
    if job.gaps():
        skipped = ", ".join(f"workerpool{i}" for i in job.gaps())
        raise ConfigError("--format gcloud-config", f"gcloud's --config rejects empty worker pools, and this job "
                          f"skips {skipped}; use --format gcloud-command, json or python")
    header = (f"# {job.display_name}: gcloud ai custom-jobs create --region={shlex.quote(region)} "
              f"--display-name={shlex.quote(job.display_name)} --config=THIS_FILE\n")
    return header + yamltext.dump(job.rest_job_spec())


def gcloud_list(values: list[str]) -> str:
    """A gcloud list-flag value that survives commas inside the items (``^|^a,b|c``)."""
    if values and values[-1] == "":
        raise ConfigError("--format gcloud-command", "gcloud's --args drops an empty last argument; "
                          "use --format gcloud-config or json")
    text = "".join(values)
    if "," not in text and not (values and values[0].startswith("^")):
        return ",".join(values)
    for delim in _DELIMITERS:
        if delim not in text:
            return f"^{delim}^" + delim.join(values)
    raise ConfigError("--format gcloud-command", "the args use every delimiter gcloud's --args could take; "
                      "use --format gcloud-config or json")


def _pool_flag(pool: PoolSpec | None) -> str:
    if pool is None:
        return "--worker-pool-spec="  # an empty value skips the pool (not allowed for the first)
    fields = [f"machine-type={pool.machine_type}", f"replica-count={pool.replicas}"]
    if pool.accelerator is not None:
        fields += [f"accelerator-type={pool.accelerator[0]}", f"accelerator-count={pool.accelerator[1]}"]
    fields.append(f"container-image-uri={pool.image_uri}")
    return "--worker-pool-spec=" + ",".join(fields)


def render_gcloud_command(job: JobSpec, region: str, project: str | None) -> tuple[str, list[str]]:
    """The ``gcloud ai custom-jobs create`` command line, and warnings about what it cannot say exactly."""
    if job.base_output_dir:
        raise ConfigError("--format gcloud-command", "gcloud ai custom-jobs create has no flag for "
                          "--base-output-dir; use --format gcloud-config, json or python")
    args = {p.args for p in job.present() if not machines.is_reduction_server(p.image_uri)}
    if len(args) > 1:
        raise ConfigError("--format gcloud-command", "gcloud's --args is one list for every pool, and these "
                          "pools' args differ; use --format gcloud-config or json")
    run_args = list(args.pop()) if args else []
    warnings = []
    if run_args and any(machines.is_reduction_server(p.image_uri) for p in job.present()):
        warnings.append("gcloud gives --args to every pool, the reducers' too; --format gcloud-config or json "
                        "keep them off the reducers")
    words = [f"--region={region}"]
    words += [f"--project={project}"] if project else []
    words.append(f"--display-name={job.display_name}")
    words += [_pool_flag(job.pool(i)) for i in range(len(job.pools))]
    if run_args:
        words.append("--args=" + gcloud_list(run_args))
    return "gcloud ai custom-jobs create " + " \\\n  ".join(shlex.quote(w) for w in words) + "\n", warnings


def _snake(value: Any) -> Any:
    """REST camelCase keys as the Python client's snake_case ones."""
    if isinstance(value, dict):
        return {re.sub(r"(?<!^)([A-Z])", r"_\1", k).lower(): _snake(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_snake(v) for v in value]
    return value


def _indented(value: Any, indent: int) -> str:
    """A Python literal (JSON's syntax is Python's for dicts, lists, strings and ints)."""
    return json.dumps(value, indent=4, ensure_ascii=False).replace("\n", "\n" + " " * indent)


def render_python(job: JobSpec, region: str, project: str | None) -> str:
    """A script that submits the job with google-cloud-aiplatform (``pip install google-cloud-aiplatform``)."""
    if job.base_output_dir:
        bucket = "gs://" + job.base_output_dir[len("gs://"):].split("/", 1)[0]
        staging = f"staging_bucket={json.dumps(bucket)},"
    else:
        staging = 'staging_bucket="gs://YOUR_BUCKET",  # outputs go under it: give job vertex --base-output-dir'
    init = [f"location={json.dumps(region)},", staging]
    if project:
        init.insert(0, f"project={json.dumps(project)},")
    job_args = [f"display_name={json.dumps(job.display_name, ensure_ascii=False)},",
                "worker_pool_specs=worker_pool_specs,"]
    if job.base_output_dir:
        job_args.append(f"base_output_dir={json.dumps(job.base_output_dir, ensure_ascii=False)},")
    lines = [
        '"""Submit a Vertex AI CustomJob (written by `python -m entrypoint job vertex --format python`)."""',
        "from google.cloud import aiplatform",
        "",
        "aiplatform.init(",
        *(f"    {a}" for a in init),
        ")",
        "",
        f"worker_pool_specs = {_indented(_snake(job.rest_pools()), 0)}",
        "",
        "job = aiplatform.CustomJob(",
        *(f"    {a}" for a in job_args),
        ")",
        "job.submit()  # returns once the job is created; job.run() instead waits for it to finish",
    ]
    return "\n".join(lines) + "\n"
