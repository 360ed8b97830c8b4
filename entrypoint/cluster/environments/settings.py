"""Platform settings that are not cluster layout: image defaults, output dirs, GPUs, the worker handoff, secrets."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from entrypoint.cluster import envvars as ev
from entrypoint.errors import ConfigError

_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSW(OR)?D|CREDENTIAL|PRIVATE|AUTH)", re.IGNORECASE)
_MIN_SECRET_LENGTH = 4  # shorter values ("1", "yes") would blank out ordinary text
DEFAULT_SBOM = "/usr/share/trainer/sbom.cdx.json"  # where every image keeps its bill of materials (docs/images.md)


@dataclass(frozen=True)
class PlatformSettings:
    """What the image and the platform configured besides the cluster: defaults for the CLI."""

    framework: str | None = None
    module: str | None = None
    model_dir: str | None = None
    checkpoint_dir: str | None = None
    tensorboard_dir: str | None = None
    job_dir: str | None = None
    cuda_visible_devices: str | None = None
    kubernetes: bool = False  # running in a Kubernetes pod (its termination log applies)
    log_format: str | None = None  # TRAINER_LOG_FORMAT: the default --log-format (checked by the CLI)
    trial: str | None = None  # CLOUD_ML_TRIAL_ID as set (a label on JSON log lines)
    metric_file: str | None = None  # CLOUD_ML_HP_METRIC_FILE: where the platform (or `local`) reads tuning metrics
    cuda_version: str | None = None  # the base image's CUDA (nvidia/cuda images set CUDA_VERSION)
    nccl_socket_ifname: str | None = None  # the user's NCCL_SOCKET_IFNAME, checked by `doctor`
    gloo_socket_ifname: str | None = None  # the user's GLOO_SOCKET_IFNAME, likewise
    restart_count: int = 0  # how many times the platform restarted this replica (TRAINER_RESTART_COUNT)
    run_started: float = 0.0  # when `local` started this run (TRAINER_RUN_STARTED); 0: no supervisor said
    cpus: int | None = None  # the CPUs this replica may use (TRAINER_CPUS: `local` sets each replica's share)
    fabric: str | None = None  # TRAINER_FABRIC: the default --fabric (checked by cluster/fabric.py)
    fabric_root: str = "/"  # TRAINER_FABRIC_ROOT (tests only): where the node's tree is for the fabric step
    fork_server: bool = True  # TRAINER_FORK_SERVER: a node's ranks are forked from one warm process (off: exec)
    fabric_applied: bool = False  # TRAINER_FABRIC_APPLIED: the entrypoint started again with the step applied
    image: str | None = None  # TRAINER_IMAGE: the image reference the job's spec ran (NAME@sha256:... when pinned)
    sbom: str = DEFAULT_SBOM  # TRAINER_SBOM: where the image's bill of materials is
    # Kubeflow Trainer's progress endpoint (its TrainJobStatus feature; outputs/goodput/kubeflow_progress.py posts
    # to it):
    kubeflow_server_url: str | None = None  # KUBEFLOW_TRAINER_SERVER_URL: where the TrainJob's progress is POSTed
    kubeflow_server_ca_cert: str | None = None  # KUBEFLOW_TRAINER_SERVER_CA_CERT: the path of its CA certificate
    kubeflow_server_token_file: str | None = None  # KUBEFLOW_TRAINER_SERVER_TOKEN: the path of its bearer token
    # The user's values of variables a framework sets defaults for (OMP_NUM_THREADS, HOROVOD_FUSION_THRESHOLD...):
    # each framework reads its own (``user_values``), and the user's value wins over its default.
    user_set: tuple[tuple[str, str], ...] = ()

    def user_values(self, names: tuple[str, ...]) -> dict[str, str]:
        """The user's values among ``names`` (a framework's ``user_variables``)."""
        return {name: value for name, value in self.user_set if name in names}


def read_settings(environ: Mapping[str, str] | None = None) -> PlatformSettings:
    """Read TRAINER_*, AIP_*, CUDA_*, the socket interface choices and Kubeflow Trainer's progress endpoint (empty
    strings count as unset); a bad restart count is a ConfigError."""
    env = os.environ if environ is None else environ

    def get(name: str) -> str | None:
        value = env.get(name, "").strip()
        return value or None

    return PlatformSettings(
        framework=get(ev.TRAINER_FRAMEWORK),
        module=get(ev.TRAINER_MODULE),
        model_dir=get(ev.AIP_MODEL_DIR),
        checkpoint_dir=get(ev.AIP_CHECKPOINT_DIR),
        tensorboard_dir=get(ev.AIP_TENSORBOARD_LOG_DIR),
        job_dir=get(ev.TRAINER_JOB_DIR),
        cuda_visible_devices=env.get(ev.CUDA_VISIBLE_DEVICES),
        kubernetes=bool(get(ev.KUBERNETES_SERVICE_HOST)),
        log_format=get(ev.TRAINER_LOG_FORMAT),
        trial=get(ev.CLOUD_ML_TRIAL_ID),
        metric_file=get(ev.CLOUD_ML_HP_METRIC_FILE),
        cuda_version=get(ev.CUDA_VERSION),
        nccl_socket_ifname=get(ev.NCCL_SOCKET_IFNAME),
        gloo_socket_ifname=get(ev.GLOO_SOCKET_IFNAME),
        restart_count=_count(ev.TRAINER_RESTART_COUNT, get(ev.TRAINER_RESTART_COUNT)),
        run_started=_run_started(get(ev.TRAINER_RUN_STARTED)),
        cpus=_cpus(get(ev.TRAINER_CPUS)),
        fabric=get(ev.TRAINER_FABRIC),
        fabric_root=get(ev.TRAINER_FABRIC_ROOT) or "/",
        fabric_applied=bool(get(ev.TRAINER_FABRIC_APPLIED)),
        fork_server=_switch(ev.TRAINER_FORK_SERVER, get(ev.TRAINER_FORK_SERVER)),
        image=get(ev.TRAINER_IMAGE),
        sbom=get(ev.TRAINER_SBOM) or DEFAULT_SBOM,
        kubeflow_server_url=get(ev.KUBEFLOW_TRAINER_SERVER_URL),
        kubeflow_server_ca_cert=get(ev.KUBEFLOW_TRAINER_SERVER_CA_CERT),
        kubeflow_server_token_file=get(ev.KUBEFLOW_TRAINER_SERVER_TOKEN),
        user_set=tuple(sorted(user_overrides(ev.FRAMEWORK_DEFAULTED, env).items())),
    )


def _switch(name: str, value: str | None) -> bool:
    """On (unset, 1, true, on, yes) or off (0, false, off, no); anything else is a configuration error naming it."""
    if value is None or value.lower() in ("1", "true", "on", "yes"):
        return True
    if value.lower() in ("0", "false", "off", "no"):
        return False
    raise ConfigError(name, "must be 1/true/on or 0/false/off; the value set is neither (values are never echoed)")


def _count(name: str, value: str | None) -> int:
    """A non-negative whole number (unset: 0); anything else is a configuration error naming the variable."""
    if value is None:
        return 0
    if not value.isdigit() or not value.isascii():
        raise ConfigError(name, "must be a whole number >= 0 (the platform's restarts of this replica); the value "
                                "set is not one (values are never echoed)")
    return int(value)


def host_cpus(environ: Mapping[str, str] | None = None) -> int:
    """The CPUs this process may use: TRAINER_CPUS where it is set (a container limited to fewer than the host
    shows; a bad value is a ConfigError), else its CPU affinity."""
    env = os.environ if environ is None else environ
    given = _cpus(env.get(ev.TRAINER_CPUS, "").strip() or None)
    if given is not None:
        return given
    return affinity_cpus()


def affinity_cpus() -> int:
    """The CPUs this process may run on (its affinity; the host's count where the platform has none)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _run_started(value: str | None) -> float:
    """A wall-clock time in seconds (unset: 0); anything else is a configuration error naming the variable."""
    if value is None:
        return 0.0
    try:
        started = float(value)
    except ValueError:
        started = -1.0
    if not started >= 0 or started == float("inf"):
        raise ConfigError(ev.TRAINER_RUN_STARTED, "must be a wall-clock time in seconds (`local` sets it); the value "
                                                  "set is not one (values are never echoed)")
    return started


def _cpus(value: str | None) -> int | None:
    """A whole number >= 1 (unset: None); anything else is a configuration error naming the variable."""
    if value is None:
        return None
    if not value.isdigit() or not value.isascii() or int(value) < 1:
        raise ConfigError(ev.TRAINER_CPUS, "must be a whole number >= 1 (the CPUs this replica may use); the value "
                                           "set is not one (values are never echoed)")
    return int(value)


@dataclass(frozen=True)
class Handoff:
    """What a worker process learns from its launcher: the plan file, its local rank, torch's error file."""

    plan_file: str | None
    local_rank: int
    error_file: str | None
    horovod_rendezvous: tuple[str, int] | None = None  # our Horovod launcher's rendezvous server (a KV store)


def read_handoff(rank_variables: tuple[str, ...], environ: Mapping[str, str] | None = None) -> Handoff:
    """TRAINER_PLAN_FILE, and the local rank from the first of ``rank_variables`` set (each framework's record names
    the variable its launcher uses: LOCAL_RANK for torch's elastic agent, HOROVOD_LOCAL_RANK for our Horovod one)."""
    env = os.environ if environ is None else environ
    raw = next((env[name] for name in rank_variables if env.get(name)), "0")
    host, port = env.get(ev.HOROVOD_GLOO_RENDEZVOUS_ADDR, ""), env.get(ev.HOROVOD_GLOO_RENDEZVOUS_PORT, "")
    return Handoff(plan_file=env.get(ev.TRAINER_PLAN_FILE) or None,
                   local_rank=int(raw) if raw.isdigit() else 0,
                   error_file=env.get(ev.TORCHELASTIC_ERROR_FILE) or None,
                   horovod_rendezvous=(host, int(port)) if host and port.isdigit() else None)


def job_lease_token(environ: Mapping[str, str] | None = None) -> str | None:
    """``TRAINER_JOB_LEASE``: the token of the lease this node's chief holds on the job dir (the training processes
    fence their commits with it); None outside a job whose chief holds one."""
    env = os.environ if environ is None else environ
    return env.get(ev.TRAINER_JOB_LEASE) or None


def ledger_attempt(environ: Mapping[str, str] | None = None) -> str | None:
    """``TRAINER_ATTEMPT``: the attempt (of this node) the job ledger files this process's records under; set by
    the node's ``run`` for its training processes (docs/goodput.md)."""
    env = os.environ if environ is None else environ
    return env.get(ev.TRAINER_ATTEMPT) or None


def goodput_job_name(environ: Mapping[str, str] | None = None) -> str | None:
    """``TRAINER_GOODPUT_JOB_NAME``: when set, the chief also prints ml-goodput-measurement's entries (job start and
    end, each step's start) under this job name, as Cloud Logging structured lines (docs/goodput.md)."""
    env = os.environ if environ is None else environ
    return env.get(ev.TRAINER_GOODPUT_JOB_NAME) or None


def storage_emulator(environ: Mapping[str, str] | None = None) -> str | None:
    """``STORAGE_EMULATOR_HOST``: the GCS server gs:// goes to, anonymously (gcsfs's emulator setting); None: GCS."""
    env = os.environ if environ is None else environ
    return env.get(ev.STORAGE_EMULATOR_HOST) or None


def triton_cache_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """``TRITON_CACHE_DIR``: where Triton keeps its compiled kernels when the user moved them out of Inductor's cache
    directory (``--compile``'s caches in the job dir keep them too, docs/pytorch.md); None: Inductor's ``triton/``."""
    env = os.environ if environ is None else environ
    return env.get(ev.TRITON_CACHE_DIR) or None


METADATA_HOST = "metadata.google.internal"  # GCE's metadata server, as Google's libraries name it by default


def metadata_host(environ: Mapping[str, str] | None = None) -> str:
    """The metadata server's ``host[:port]``: ``GCE_METADATA_HOST`` (honoured by Google's libraries too; tests point
    it at a fake server), else GCE's own name (it resolves only where a metadata server is)."""
    env = os.environ if environ is None else environ
    return env.get(ev.GCE_METADATA_HOST, "").strip() or METADATA_HOST


def image_cache_dir(environ: Mapping[str, str] | None = None) -> str:
    """Where images/local_build.py keeps its records of this machine's builds: ``$XDG_CACHE_HOME/trainer-images``,
    else ``~/.cache/trainer-images`` (``job --pin`` of a local build reads them)."""
    env = os.environ if environ is None else environ
    base = env.get(ev.XDG_CACHE_HOME, "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "trainer-images")


def credentials_file_named(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``GOOGLE_APPLICATION_CREDENTIALS`` names a key file (its value, a secret-like name's, is not shown)."""
    env = os.environ if environ is None else environ
    return bool(env.get(ev.GOOGLE_APPLICATION_CREDENTIALS))


def user_overrides(names: tuple[str, ...], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The subset of ``names`` the user set explicitly (their values always win over our defaults)."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in names if env.get(name, "").strip()}


def is_secret_name(name: str) -> bool:
    """Whether a variable or flag name looks like it holds a key, token, password or credential."""
    return bool(_SECRET_NAME.search(name))


def secret_like_names(environ: Mapping[str, str] | None = None) -> list[str]:
    """Names (never values) of variables that look like keys, tokens, passwords or credentials."""
    env = os.environ if environ is None else environ
    return sorted(name for name in env if is_secret_name(name))


def secret_values(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Values never to print: secret-looking variables, and secrets inside CLUSTER_SPEC / TF_CONFIG's ``job``."""
    env = os.environ if environ is None else environ
    found = {value for name, value in env.items() if is_secret_name(name)}
    for variable in (ev.CLUSTER_SPEC, ev.TF_CONFIG):
        try:
            spec = json.loads(env.get(variable) or "{}")
        except (ValueError, RecursionError):
            continue
        if isinstance(spec, dict) and "job" in spec:
            found.update(_secrets_in(spec["job"]))
    return frozenset(v for v in found if len(v) >= _MIN_SECRET_LENGTH)


def secrets_in_args(args: list[str] | tuple[str, ...]) -> set[str]:
    """Values of secret-looking flags in an argument list (``--token X`` and ``--token=X``)."""
    found: set[str] = set()
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag.startswith("-") and is_secret_name(flag):
            if eq:
                found.add(value)
            elif i + 1 < len(args):
                found.add(args[i + 1])
    return found


def _secrets_in(value: Any, depth: int = 0) -> Iterator[str]:
    """Secret-looking values in a job description: secret keys' values, secret flags' values, env entries."""
    if depth > 20:
        return
    if isinstance(value, dict):
        name = value.get("name")
        if isinstance(name, str) and is_secret_name(name) and isinstance(value.get("value"), str):
            yield value["value"]
        for key, item in value.items():
            if isinstance(item, str) and is_secret_name(str(key)):
                yield item
            else:
                yield from _secrets_in(item, depth + 1)
    elif isinstance(value, list):
        strings = [v for v in value if isinstance(v, str)]
        yield from secrets_in_args(strings)
        for item in value:
            if not isinstance(item, str):
                yield from _secrets_in(item, depth + 1)
    elif isinstance(value, str):
        yield from secrets_in_args(value.split())
