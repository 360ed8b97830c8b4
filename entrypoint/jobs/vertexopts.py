"""``job vertex`` options every real job needs: scheduling, identity and network, labels, env, disk, CMEK, reservations.

Each becomes the CustomJob field of the same meaning (REST reference:
https://cloud.google.com/vertex-ai/docs/reference/rest/v1/CustomJobSpec and .../v1/projects.locations.customJobs);
values are checked here so that a malformed one fails before anything is submitted.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments.settings import is_secret_name
from entrypoint.errors import ConfigError
from entrypoint.jobs.model import JobSettings

DISK_TYPES = ("pd-ssd", "pd-standard", "hyperdisk-balanced")
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?")
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
_NETWORK = re.compile(r"projects/\d+/global/networks/[a-z]([-a-z0-9]*[a-z0-9])?")
_TENSORBOARD = re.compile(r"projects/[^/]+/locations/(?P<loc>[^/]+)/tensorboards/\d+")
_KMS = re.compile(r"projects/[^/]+/locations/(?P<loc>[^/]+)/keyRings/[^/]+/cryptoKeys/[^/]+")
_RESOURCE_ID = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_RESERVATION = re.compile(r"(projects/[^/]+/zones/[^/]+/reservations/)?[a-z]([-a-z0-9]*[a-z0-9])?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Set by Vertex AI in every replica (docs/ENVIRONMENT.md): a job's own value would fight them.
_VERTEX_SETS = (ev.CLUSTER_SPEC, ev.TF_CONFIG, ev.CLOUD_ML_TRIAL_ID)


@dataclass(frozen=True)
class PoolExtras:
    """What every pool on our image gets besides machine and args: env, boot disk, reservation."""

    env: tuple[tuple[str, str], ...] = ()
    disk_type: str | None = None
    disk_size_gb: int | None = None
    reservation: tuple[str, tuple[str, ...]] | None = None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options shared by ``job vertex`` and ``job vertex-tuning``."""
    s = p.add_argument_group("scheduling (CustomJobSpec.scheduling)")
    strategy = s.add_mutually_exclusive_group()
    strategy.add_argument("--spot", action="store_true", help="Spot VMs: cheaper, may be preempted (strategy SPOT)")
    strategy.add_argument("--flex-start", action="store_true",
                          help="wait for capacity with Dynamic Workload Scheduler (strategy FLEX_START)")
    s.add_argument("--max-wait", metavar="DURATION", help="with --flex-start: how long to wait for capacity "
                   "(e.g. 2h; 0 = indefinitely; Vertex's default 24h)")
    s.add_argument("--timeout", metavar="DURATION", help="the job's maximum running time (e.g. 36h; default 7d)")
    s.add_argument("--restart-job-on-worker-restart", action="store_true",
                   help="restart every replica when one restarts")
    s.add_argument("--disable-retries", action="store_true", help="do not retry after internal errors")
    n = p.add_argument_group("identity and network")
    n.add_argument("--service-account", metavar="EMAIL", help="the service account the replicas run as")
    n.add_argument("--network", metavar="projects/NUMBER/global/networks/NAME", help="a peered VPC network")
    n.add_argument("--reserved-ip-range", action="append", default=[], metavar="NAME",
                   help="an IP range reserved in --network (repeatable)")
    n.add_argument("--enable-web-access", action="store_true", help="interactive shells into the replicas")
    n.add_argument("--tensorboard", metavar="projects/P/locations/L/tensorboards/ID",
                   help="a Vertex AI TensorBoard to upload AIP_TENSORBOARD_LOG_DIR to (needs --service-account)")
    r = p.add_argument_group("resources")
    r.add_argument("--labels", action="append", default=[], metavar="KEY=VALUE[,...]", help="job labels")
    r.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="container environment of our pools (repeatable)")
    r.add_argument("--boot-disk-type", choices=DISK_TYPES, help="default pd-ssd (hyperdisk-balanced on A3 Ultra)")
    r.add_argument("--boot-disk-size", type=int, metavar="GB", help="boot disk size (default 100)")
    r.add_argument("--kms-key", metavar="projects/P/locations/L/keyRings/R/cryptoKeys/K",
                   help="customer-managed encryption key (in --region)")
    r.add_argument("--persistent-resource-id", metavar="ID", help="run on a persistent resource's machines")
    r.add_argument("--reservation", metavar="any|none|NAME",
                   help="reservation affinity of the training pools: any, none, or a reservation "
                   "(NAME or projects/P/zones/Z/reservations/NAME)")


def duration_seconds(text: str, flag: str) -> int:
    """``90``, ``90s``, ``30m``, ``2h``, ``1d12h``: whole seconds."""
    match = _DURATION.fullmatch(text.strip())
    if not text.strip() or match is None:
        raise ConfigError(flag, "expected a duration such as 90s, 30m, 2h or 1d12h")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def parse_pairs(items: list[str], flag: str, split_commas: bool) -> list[tuple[str, str]]:
    """``KEY=VALUE`` items (``a=1,b=2`` too where ``split_commas``); errors name keys, never values."""
    pairs = []
    for item in items:
        for part in item.split(",") if split_commas else [item]:
            key, eq, value = part.partition("=")
            if not eq or not key:
                raise ConfigError(flag, "expected KEY=VALUE")
            pairs.append((key, value))
    keys = [k for k, _ in pairs]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ConfigError(flag, f"given more than once: {', '.join(dupes)}")
    return pairs


def _label_ok(text: str, key: bool) -> bool:
    if len(text) > 64 or (key and not (text and text[0].isalpha() and text[0].islower())):
        return False
    return all(c.isdigit() or c in "_-" or (c.isalpha() and c.islower()) for c in text)


def check_labels(labels: list[tuple[str, str]]) -> None:
    """CustomJob.labels' rules: at most 64; keys start with a lowercase letter; <= 64 of [a-z0-9_-] (any script)."""
    if len(labels) > 64:
        raise ConfigError("--labels", "at most 64 labels")
    for key, value in labels:
        if not _label_ok(key, True) or not _label_ok(value, False):
            raise ConfigError("--labels", f"{key[:64]}: keys start with a lowercase letter; keys and values have at "
                              "most 64 lowercase letters, digits, '_' or '-'")


def check_env(env: list[tuple[str, str]], flag: str) -> list[str]:
    """Valid names, none Vertex sets itself; warnings for secret-looking names (their values are in the spec)."""
    warnings = []
    for name, _ in env:
        if not _ENV_NAME.fullmatch(name):
            raise ConfigError(flag, f"{name[:40]!r} is not an environment variable name")
        if name in _VERTEX_SETS or name.startswith("AIP_"):
            raise ConfigError(flag, f"{name} is set by the platform in every replica; do not set it")
        if is_secret_name(name):
            warnings.append(f"{flag} {name}: looks like a secret, and its value is stored in the job's spec for "
                            "anyone who can view the job; read it from Secret Manager in your code instead")
    return warnings


def _reservation(text: str | None) -> tuple[str, tuple[str, ...]] | None:
    if text is None:
        return None
    if text.lower() in ("any", "none"):
        return ("ANY_RESERVATION" if text.lower() == "any" else "NO_RESERVATION", ())
    if not _RESERVATION.fullmatch(text):
        raise ConfigError("--reservation", "expected any, none, NAME or projects/P/zones/Z/reservations/NAME")
    return ("SPECIFIC_RESERVATION", (text,))


def pool_extras(ns: argparse.Namespace) -> tuple[PoolExtras, list[str]]:
    """--env, --boot-disk-*, --reservation, checked; and warnings."""
    env = parse_pairs(ns.env, "--env", split_commas=False)
    warnings = check_env(env, "--env")
    if ns.boot_disk_size is not None and ns.boot_disk_size < 1:
        raise ConfigError("--boot-disk-size", "must be a size in GB >= 1")
    return PoolExtras(tuple(env), ns.boot_disk_type, ns.boot_disk_size, _reservation(ns.reservation)), warnings


def _check_identity(ns: argparse.Namespace, region: str) -> None:
    if ns.service_account is not None and not _EMAIL.fullmatch(ns.service_account):
        raise ConfigError("--service-account", "expected a service account e-mail "
                          "(NAME@PROJECT.iam.gserviceaccount.com)")
    if ns.network is not None and not _NETWORK.fullmatch(ns.network):
        raise ConfigError("--network", "expected projects/PROJECT_NUMBER/global/networks/NAME (a project number)")
    if ns.reserved_ip_range and ns.network is None:
        raise ConfigError("--reserved-ip-range", "names a range of a VPC network: give --network too")
    if ns.tensorboard is not None:
        if not _TENSORBOARD.fullmatch(ns.tensorboard):
            raise ConfigError("--tensorboard", "expected projects/PROJECT/locations/LOCATION/tensorboards/ID")
        if ns.service_account is None:
            raise ConfigError("--tensorboard", "uploading to a TensorBoard needs --service-account (the SDK "
                              "requires one with a tensorboard)")
    if ns.kms_key is not None:
        match = _KMS.fullmatch(ns.kms_key)
        if match is None:
            raise ConfigError("--kms-key", "expected projects/P/locations/L/keyRings/R/cryptoKeys/K")
        if match["loc"] != region:
            raise ConfigError("--kms-key", f"the key is in {match['loc']}, the job in {region}: a CMEK key must be "
                              "in the job's region")
    if ns.persistent_resource_id is not None and not _RESOURCE_ID.fullmatch(ns.persistent_resource_id):
        raise ConfigError("--persistent-resource-id", "expected 1-63 lowercase letters, digits or '-', "
                          "starting with a letter")


def settings(ns: argparse.Namespace, region: str) -> JobSettings:
    """The job-wide settings from the parsed options; ConfigError for a malformed or contradictory one."""
    if ns.max_wait is not None and not ns.flex_start:
        raise ConfigError("--max-wait", "is how long --flex-start waits for capacity: give --flex-start")
    if ns.disable_retries and ns.restart_job_on_worker_restart:
        raise ConfigError("--disable-retries", "overrides --restart-job-on-worker-restart to false: give one")
    _check_identity(ns, region)
    labels = parse_pairs(ns.labels, "--labels", split_commas=True)
    check_labels(labels)
    timeout = duration_seconds(ns.timeout, "--timeout") if ns.timeout is not None else None
    if timeout == 0:
        raise ConfigError("--timeout", "must be longer than 0s")
    strategy = "SPOT" if ns.spot else "FLEX_START" if ns.flex_start else None
    return JobSettings(
        timeout_s=timeout,
        max_wait_s=duration_seconds(ns.max_wait, "--max-wait") if ns.max_wait is not None else None,
        strategy=strategy,
        restart_job_on_worker_restart=ns.restart_job_on_worker_restart,
        disable_retries=ns.disable_retries,
        service_account=ns.service_account,
        network=ns.network,
        reserved_ip_ranges=tuple(ns.reserved_ip_range),
        enable_web_access=ns.enable_web_access,
        tensorboard=ns.tensorboard,
        persistent_resource_id=ns.persistent_resource_id,
        labels=tuple(labels),
        kms_key=ns.kms_key,
    )
