"""``job vertex`` options of the whole job: scheduling, identity and network, Experiments, labels, CMEK.

Each becomes the CustomJob field of the same meaning (REST reference:
https://cloud.google.com/vertex-ai/docs/reference/rest/v1/CustomJobSpec and .../v1/projects.locations.customJobs);
values are checked here so that a malformed one fails before anything is submitted. The pools' own options (env,
disks, reservations, mounts) are in ``jobs.vertexpools``.
"""

from __future__ import annotations

import argparse
import re
import unicodedata

from entrypoint.errors import ConfigError
from entrypoint.jobs.model import JobSettings

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?")
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
_NETWORK = re.compile(r"projects/\d+/global/networks/[a-z]([-a-z0-9]*[a-z0-9])?")
_TENSORBOARD = re.compile(r"projects/[^/]+/locations/(?P<loc>[^/]+)/tensorboards/\d+")
_KMS = re.compile(r"projects/[^/]+/locations/(?P<loc>[^/]+)/keyRings/[^/]+/cryptoKeys/[^/]+")
_RESOURCE_ID = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
# PscInterfaceConfig.networkAttachment: a name in the job's project and region, or the full name (Shared VPC).
_ATTACHMENT = re.compile(r"(projects/[^/]+/regions/(?P<region>[^/]+)/networkAttachments/)?[a-z]([-a-z0-9]{0,61}"
                         r"[a-z0-9])?")
_DOMAIN = re.compile(r"([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)+")  # DnsPeeringConfig.domain: "Must end with a dot."
# Vertex AI Experiments: metadata contexts of the default store; a run's context id is "<experiment>-<run>"
# (the SDK's ExperimentRun), at most 121 characters (128 less the SDK's "-tb-run").
_EXPERIMENT = re.compile(r"(projects/(?P<project>[^/]+)/locations/(?P<loc>[^/]+)/metadataStores/default/contexts/)?"
                         r"(?P<name>[a-z0-9][a-z0-9-]{0,127})")
_RUN_ID_MAX = 121
# A Google Cloud region's name: a geography, a direction, a number (https://cloud.google.com/compute/docs/regions-zones).
_REGION = re.compile(r"(us|europe|asia|northamerica|southamerica|australia|me|africa)-"
                     r"(north|south|east|west|central|northeast|northwest|southeast|southwest)\d{1,2}")


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
    n.add_argument("--psc-network-attachment", metavar="NAME|projects/P/regions/R/networkAttachments/NAME",
                   help="a Private Service Connect interface into your VPC (pscInterfaceConfig)")
    n.add_argument("--psc-dns-peering", action="append", default=[], metavar="DOMAIN.=TARGET_PROJECT/TARGET_NETWORK",
                   help="resolve DOMAIN (ending with a dot) in that VPC network's DNS (repeatable)")
    n.add_argument("--enable-dashboard-access", action="store_true",
                   help="the chief container's own dashboard, at the job's web access URIs")
    x = p.add_argument_group("Vertex AI Experiments")
    x.add_argument("--experiment", metavar="NAME", help="an existing Experiment (NAME needs --project, or its full "
                   "resource name); needs --service-account, not with --tensorboard")
    x.add_argument("--experiment-run", metavar="RUN", help="the Experiment's run to report to")
    r = p.add_argument_group("resources")
    r.add_argument("--labels", action="append", default=[], metavar="KEY=VALUE[,...]", help="job labels")
    r.add_argument("--kms-key", metavar="projects/P/locations/L/keyRings/R/cryptoKeys/K",
                   help="customer-managed encryption key (in --region)")
    r.add_argument("--persistent-resource-id", metavar="ID", help="run on a persistent resource's machines")


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


# Google Cloud's label grammar, as its APIs publish it (e.g. Bigtable Admin's Instance.labels): keys
# [\p{Ll}\p{Lo}][\p{Ll}\p{Lo}\p{N}_-]*, values [\p{Ll}\p{Lo}\p{N}_-]*: a lowercase letter (Ll) or a letter of a
# script without case (Lo, "international characters"), then those and numbers of any kind (Nd, Nl, No).
_FIRST = ("Ll", "Lo")
_REST = ("Ll", "Lo", "Nd", "Nl", "No")


def _label_ok(text: str, key: bool) -> bool:
    if len(text) > 64 or (key and not (text and unicodedata.category(text[0]) in _FIRST)):
        return False
    return all(c in "_-" or unicodedata.category(c) in _REST for c in text)


def check_labels(labels: list[tuple[str, str]]) -> None:
    r"""CustomJob.labels' rules: at most 64; keys start with a lowercase letter or an international character; keys
    and values <= 64 Unicode code points of lowercase letters (any script), numbers, '_', '-' (Google Cloud's grammar:
    ``\p{Ll}``, ``\p{Lo}``, ``\p{N}``: a titlecase or modifier letter is none of them)."""
    if len(labels) > 64:
        raise ConfigError("--labels", "at most 64 labels")
    for key, value in labels:
        if not _label_ok(key, True) or not _label_ok(value, False):
            raise ConfigError("--labels", f"{key[:64]}: keys start with a lowercase letter (of any script); keys and "
                              "values have at most 64 lowercase letters, digits, '_' or '-'")


def _check_identity(ns: argparse.Namespace, region: str) -> None:
    if ns.service_account is not None and not _EMAIL.fullmatch(ns.service_account):
        raise ConfigError("--service-account", "expected a service account e-mail "
                          "(NAME@PROJECT.iam.gserviceaccount.com)")
    if ns.network is not None and not _NETWORK.fullmatch(ns.network):
        raise ConfigError("--network", "expected projects/PROJECT_NUMBER/global/networks/NAME (a project number)")
    if ns.reserved_ip_range and ns.network is None:
        raise ConfigError("--reserved-ip-range", "names a range of a VPC network: give --network too")
    if ns.tensorboard is not None:
        board = _TENSORBOARD.fullmatch(ns.tensorboard)
        if board is None:
            raise ConfigError("--tensorboard", "expected projects/PROJECT/locations/LOCATION/tensorboards/ID")
        if ns.service_account is None:
            raise ConfigError("--tensorboard", "uploading to a TensorBoard needs --service-account (the SDK "
                              "requires one with a tensorboard)")
        if board["loc"] != region:
            raise ConfigError("--tensorboard", f"the TensorBoard is in {board['loc']}, the job in {region}: a job "
                              "uses the Vertex AI resources of its own region")
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


def _psc(ns: argparse.Namespace, region: str) -> tuple[tuple[str, str, str], ...]:
    if ns.psc_network_attachment is None:
        if ns.psc_dns_peering:
            raise ConfigError("--psc-dns-peering", "peers DNS through a Private Service Connect interface: give "
                              "--psc-network-attachment")
        return ()
    match = _ATTACHMENT.fullmatch(ns.psc_network_attachment)
    if match is None:
        raise ConfigError("--psc-network-attachment", "expected NAME or projects/P/regions/R/networkAttachments/NAME")
    if match["region"] is not None and match["region"] != region:
        raise ConfigError("--psc-network-attachment", f"the attachment is in {match['region']}, the job in {region}: "
                          "a network attachment serves its own region")
    peering = []
    for text in ns.psc_dns_peering:
        domain, eq, target = text.partition("=")
        project, slash, network = target.partition("/")
        if not (eq and slash and project and network) or not _DOMAIN.fullmatch(domain):
            raise ConfigError("--psc-dns-peering", "expected DOMAIN.=TARGET_PROJECT/TARGET_NETWORK, the domain ending "
                              "with a dot")
        peering.append((domain, project, network))
    return tuple(peering)


def _experiment(ns: argparse.Namespace, region: str) -> tuple[str | None, str | None]:
    """Full resource names of --experiment and --experiment-run (the API takes them)."""
    if ns.experiment is None:
        if ns.experiment_run is not None:
            raise ConfigError("--experiment-run", "is a run of an Experiment: give --experiment")
        return None, None
    match = _EXPERIMENT.fullmatch(ns.experiment)
    if match is None:
        raise ConfigError("--experiment", "expected an Experiment's name (1-128 lowercase letters, digits, '-') or "
                          "projects/P/locations/L/metadataStores/default/contexts/NAME")
    if match["loc"] is not None and match["loc"] != region:
        raise ConfigError("--experiment", f"the Experiment is in {match['loc']}, the job in {region}")
    project = match["project"] or ns.project
    if project is None:
        raise ConfigError("--experiment", "the API takes the Experiment's full resource name: give --project (or "
                          "the full name)")
    if ns.tensorboard is not None:
        raise ConfigError("--experiment", "an Experiment has its own TensorBoard: not with --tensorboard (the SDK "
                          "refuses 'experiment' and 'tensorboard' together)")
    if ns.service_account is None:
        raise ConfigError("--experiment", "reporting to an Experiment needs --service-account (the SDK requires one)")
    name = f"projects/{project}/locations/{region}/metadataStores/default/contexts/{match['name']}"
    if ns.experiment_run is None:
        return name, None
    run = ns.experiment_run
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", run) or len(f"{match['name']}-{run}") > _RUN_ID_MAX:
        raise ConfigError("--experiment-run", f"expected lowercase letters, digits and '-', the experiment's name, '-' "
                          f"and the run at most {_RUN_ID_MAX} characters")
    return name, f"{name}-{run}"


def check_region(region: str) -> None:
    """--region has a region's form (``us-central1``): a typo would send the job nowhere and pick the reducers'
    image from the wrong multi-region. Whether Vertex AI trains there is the API's to say (its list changes)."""
    if not _REGION.fullmatch(region):
        raise ConfigError("--region", "expected a Google Cloud region such as us-central1, europe-west4 or "
                          "asia-southeast1 (a zone such as us-central1-a is not a region)")


def settings(ns: argparse.Namespace, region: str) -> JobSettings:
    """The job-wide settings from the parsed options; ConfigError for a malformed or contradictory one."""
    check_region(region)
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
    experiment, experiment_run = _experiment(ns, region)
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
        psc_network_attachment=ns.psc_network_attachment,
        psc_dns_peering=_psc(ns, region),
        experiment=experiment,
        experiment_run=experiment_run,
        enable_dashboard_access=ns.enable_dashboard_access,
    )
