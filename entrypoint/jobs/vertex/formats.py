"""The four ways ``job vertex`` writes a job: REST JSON, gcloud --config YAML, a gcloud command, Python.

gcloud's own limits (read in gcloud 528.0.0's code and RELEASE_NOTES): ``hp-tuning-jobs create`` decodes its
--config with the track's API messages, so a field the GA messages lack is refused there (pscInterfaceConfig:
``gcloud beta`` knows it; lustreMounts: neither track), while ``custom-jobs create`` passes such fields through;
``--max-trial-count`` / ``--parallel-trial-count`` default to 1 and overwrite the file's counts up to 415.0.0;
``--persistent-resource-id`` is GA from 472.0.0 and beta from 444.0.0; ``--enable-dashboard-access`` from 415.0.0.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from typing import Any

from entrypoint.cluster import envvars as ev
from entrypoint.errors import ConfigError
from entrypoint.jobs import network, yamltext
from entrypoint.jobs.model import JobSettings, JobSpec, PoolSpec

FORMATS = ("json", "gcloud-config", "gcloud-command", "python")
# gcloud list flags split on commas; `gcloud topic escaping`: ^D^ first picks another delimiter D.
_DELIMITERS = "|;:@#~!%+"


def render_json(resource: dict[str, Any]) -> str:
    """A resource (CustomJob, HyperparameterTuningJob) as its REST ``create`` takes it (camelCase)."""
    return json.dumps(resource, indent=2, ensure_ascii=False) + "\n"


def resource_flags(settings: JobSettings) -> list[str]:
    """gcloud flags for the resource's own fields, which a --config file (a job spec) cannot hold."""
    words = []
    if settings.labels:
        words.append("--labels=" + gcloud_list([f"{k}={v}" for k, v in settings.labels]))
    if settings.kms_key:
        words.append(f"--kms-key={settings.kms_key}")
    return words


def render_gcloud_config(job: JobSpec, region: str, command: str = "custom-jobs",
                         document: dict[str, Any] | None = None) -> str:
    """The YAML for ``gcloud ai custom-jobs create --config`` (a CustomJobSpec), or another command's document."""
    if job.gaps():
        skipped = ", ".join(f"workerpool{i}" for i in job.gaps())
        raise ConfigError("--format gcloud-config", f"gcloud's --config rejects empty worker pools, and this job "
                          f"skips {skipped}; use --format json{', gcloud-command' if document is None else ''}")
    flags = [f"--region={region}", f"--display-name={job.display_name}", *resource_flags(job.settings)]
    if document is not None and command == "hp-tuning-jobs":
        if any(p.lustre_mounts for p in job.present()):
            raise ConfigError("--format gcloud-config", "gcloud ai hp-tuning-jobs create refuses lustreMounts in "
                              "its --config (GA and beta); use --format json or python")
        # gcloud up to 415.0.0 overwrites the file's counts with these flags' default, 1: say them on the line.
        flags += [f"--max-trial-count={document['maxTrialCount']}",
                  f"--parallel-trial-count={document['parallelTrialCount']}"]
    words = " ".join(one_line_word(f) for f in flags)  # one comment line, the same values
    track = "beta " if job.settings.psc_network_attachment else ""  # the GA messages lack pscInterfaceConfig
    header = f"# gcloud {track}ai {command} create {words} --config=THIS_FILE\n"
    return header + yamltext.dump(document if document is not None else job.rest_job_spec())


def one_line_word(word: str) -> str:
    """A shell word on one line: shlex's quoting, or bash's ``$'...'`` where the word holds a newline or another
    control character (a display name with a newline stays that name, not one with a space)."""
    if word.isprintable():
        return shlex.quote(word)
    escapes = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}

    def escaped(c: str) -> str:
        if c in escapes or c.isprintable():
            return escapes.get(c, c)
        return f"\\x{ord(c):02x}" if ord(c) < 0x80 else f"\\U{ord(c):08x}"  # \xHH above 0x7f is a byte

    return "$'" + "".join(escaped(c) for c in word) + "'"


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


# CustomJob fields gcloud ai custom-jobs create has no flag for: (how job vertex calls them, present?).
def _unsayable(job: JobSpec) -> list[str]:
    s = job.settings
    pools = job.present()
    found = [
        ("--base-output-dir", bool(job.base_output_dir)),
        ("--spot/--flex-start/--max-wait/--timeout/--restart-job-on-worker-restart/--disable-retries",
         bool(s.rest_scheduling())),
        ("--reserved-ip-range", bool(s.reserved_ip_ranges)), ("--tensorboard", bool(s.tensorboard)),
        ("--env", any(p.env for p in pools)), ("--boot-disk-type/--boot-disk-size (diskSpec)", any(
            p.disk_type or p.disk_size_gb for p in pools)), ("--reservation", any(p.reservation for p in pools)),
        ("--nfs-mount/--lustre-mount", any(p.nfs_mounts or p.lustre_mounts for p in pools)),
        ("--psc-network-attachment", bool(s.psc_network_attachment)), ("--experiment", bool(s.experiment)),
    ]
    return [name for name, present in found if present]


def _settings_flags(s: JobSettings) -> list[str]:
    words = [f"--service-account={s.service_account}"] if s.service_account else []
    words += [f"--network={s.network}"] if s.network else []
    words += ["--enable-web-access"] if s.enable_web_access else []
    words += ["--enable-dashboard-access"] if s.enable_dashboard_access else []
    words += [f"--persistent-resource-id={s.persistent_resource_id}"] if s.persistent_resource_id else []
    return words + resource_flags(s)


def render_gcloud_command(job: JobSpec, region: str, project: str | None) -> tuple[str, list[str]]:
    """The ``gcloud ai custom-jobs create`` command line, and warnings about what it cannot say exactly. gcloud has
    no flag for a pool's env: a pinned image's TRAINER_IMAGE is left out (a warning says what that costs)."""
    warnings = []
    if any(name == ev.TRAINER_IMAGE for p in job.present() for name, _ in p.env):
        job = replace(job, pools=tuple(replace(p, env=tuple(e for e in p.env if e[0] != ev.TRAINER_IMAGE))
                                       if p is not None else None for p in job.pools))
        warnings.append(f"--format gcloud-command cannot pass {ev.TRAINER_IMAGE} (gcloud has no flag for a pool's "
                        "env): doctor and the training summary will not know the digest the job ran; --format "
                        "gcloud-config, json or python pass it")
    unsayable = _unsayable(job)
    if unsayable:
        raise ConfigError("--format gcloud-command", f"gcloud ai custom-jobs create has no flag for "
                          f"{', '.join(unsayable)}; use --format gcloud-config, json or python")
    args = {p.args for p in job.present() if not network.is_reduction_server(p.image_uri)}
    if len(args) > 1:
        raise ConfigError("--format gcloud-command", "gcloud's --args is one list for every pool, and these "
                          "pools' args differ; use --format gcloud-config or json")
    run_args = list(args.pop()) if args else []
    if run_args and any(network.is_reduction_server(p.image_uri) for p in job.present()):
        warnings.append("gcloud gives --args to every pool, the reducers' too; --format gcloud-config or json "
                        "keep them off the reducers")
    words = [f"--region={region}"]
    words += [f"--project={project}"] if project else []
    words.append(f"--display-name={job.display_name}")
    words += _settings_flags(job.settings)
    words += [_pool_flag(job.pool(i)) for i in range(len(job.pools))]
    if run_args:
        words.append("--args=" + gcloud_list(run_args))
    # --persistent-resource-id: GA from gcloud 472.0.0, beta from 444.0.0 (when the field came): beta takes it on all.
    command = "gcloud beta ai custom-jobs create " if job.settings.persistent_resource_id else \
        "gcloud ai custom-jobs create "
    return command + " \\\n  ".join(shlex.quote(w) for w in words) + "\n", warnings


