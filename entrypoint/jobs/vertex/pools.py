"""``job vertex`` options of the pools on our image: env, boot disk, reservation, NFS and Lustre mounts, evaluators.

Each is a WorkerPoolSpec field (https://cloud.google.com/vertex-ai/docs/reference/rest/v1/CustomJobSpec#workerpoolspec):
``containerSpec.env`` (at most 100: ContainerSpec.env, "Maximum limit is 100"), ``diskSpec``,
``machineSpec.reservationAffinity`` (its values "must be the full resource name of the reservation":
ReservationAffinity; reservations are zonal, https://cloud.google.com/compute/docs/instances/choose-reservation-type),
``nfsMounts`` / ``lustreMounts`` (mounted under /mnt/nfs/<mountPoint> and /mnt/lustre/<mountPoint>; the share is
reached over the job's VPC network, by VPC peering or a Private Service Connect interface:
https://cloud.google.com/vertex-ai/docs/training/train-nfs-share). The evaluators (workerpool3) may have machines
of their own.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
from dataclasses import dataclass

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments.settings import is_secret_name
from entrypoint.errors import ConfigError
from entrypoint.jobs.model import JobSettings
from entrypoint.jobs.vertex.options import parse_pairs

DISK_TYPES = ("pd-ssd", "pd-standard", "hyperdisk-balanced")
MAX_ENV = 100  # ContainerSpec.env: "Maximum limit is 100."
_RESERVATION = re.compile(r"projects/[^/]+/zones/(?P<zone>[a-z]+-[a-z]+\d+-[a-z])/reservations/"
                          r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MOUNT_POINT = re.compile(r"[A-Za-z0-9_.-]+")  # a directory name under /mnt/nfs or /mnt/lustre
# Set by Vertex AI in every replica (docs/ENVIRONMENT.md): a job's own value would fight them.
_VERTEX_SETS = (ev.CLUSTER_SPEC, ev.TF_CONFIG, ev.CLOUD_ML_TRIAL_ID)


@dataclass(frozen=True)
class PoolExtras:
    """What every pool on our image gets besides machine and args: env, boot disk, reservation, mounts."""

    env: tuple[tuple[str, str], ...] = ()
    disk_type: str | None = None
    disk_size_gb: int | None = None
    reservation: tuple[str, tuple[str, ...]] | None = None
    nfs_mounts: tuple[tuple[str, str, str], ...] = ()
    lustre_mounts: tuple[tuple[str, str, str, str], ...] = ()


@dataclass(frozen=True)
class EvaluatorMachines:
    """workerpool3's own machines, where they differ from the workers' (None: like the workers)."""

    machine_type: str | None = None
    accelerator: str | None = None
    disk_type: str | None = None
    disk_size_gb: int | None = None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The pool options shared by ``job vertex`` and ``job vertex-tuning``."""
    r = p.add_argument_group("pools on our image (WorkerPoolSpec)")
    r.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help=f"container environment of our pools (repeatable, at most {MAX_ENV})")
    r.add_argument("--boot-disk-type", choices=DISK_TYPES, help="default pd-ssd (hyperdisk-balanced on A3 Ultra "
                   "and A4, which boot from Hyperdisk only; N1 takes none)")
    r.add_argument("--boot-disk-size", type=int, metavar="GB", help="boot disk size (default 100)")
    r.add_argument("--reservation", metavar="any|none|projects/P/zones/Z/reservations/NAME",
                   help="reservation affinity of the training pools: any, none, or a reservation by its full name "
                   "in --region (shared with Vertex AI); not with --spot or --flex-start")
    r.add_argument("--nfs-mount", action="append", default=[], metavar="SERVER:/PATH:MOUNT_POINT",
                   help="an NFS share at /mnt/nfs/MOUNT_POINT (SERVER: its private IP; needs --network or "
                   "--psc-network-attachment), repeatable")
    r.add_argument("--lustre-mount", action="append", default=[], metavar="IP:VOLUME_HANDLE:FILESYSTEM:MOUNT_POINT",
                   help="a Managed Lustre file system at /mnt/lustre/MOUNT_POINT, repeatable")
    s = p.add_argument_group("parameter servers' boot disk (workerpool2; default: --boot-disk-*)")
    s.add_argument("--ps-boot-disk-type", choices=DISK_TYPES)
    s.add_argument("--ps-boot-disk-size", type=int, metavar="GB")
    e = p.add_argument_group("evaluators' own machines (workerpool3; default: the workers')")
    e.add_argument("--evaluator-machine-type", metavar="T")
    e.add_argument("--evaluator-accelerator", metavar="TYPE:COUNT")
    e.add_argument("--evaluator-boot-disk-type", choices=DISK_TYPES)
    e.add_argument("--evaluator-boot-disk-size", type=int, metavar="GB")


def check_env(env: list[tuple[str, str]], flag: str) -> list[str]:
    """Valid names, none Vertex sets itself, at most 100; warnings for secret-looking names (values sit in the spec)."""
    if len(env) > MAX_ENV:
        raise ConfigError(flag, f"{len(env)} variables: a container takes at most {MAX_ENV} (ContainerSpec.env)")
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


def reservation(text: str | None, region: str | None) -> tuple[str, tuple[str, ...]] | None:
    """any, none, or a specific reservation by its full resource name, in a zone of ``region`` (when known)."""
    if text is None:
        return None
    if text.lower() in ("any", "none"):
        return ("ANY_RESERVATION" if text.lower() == "any" else "NO_RESERVATION", ())
    match = _RESERVATION.fullmatch(text)
    if match is None:
        raise ConfigError("--reservation", "expected any, none, or the reservation's full name "
                          "projects/P/zones/Z/reservations/NAME (the API takes the full resource name)")
    if region is not None and not match["zone"].startswith(region + "-"):
        raise ConfigError("--reservation", f"the reservation is in {match['zone']}, the job in {region}: a "
                          "reservation is consumed in its own zone, which must be in the job's region")
    return ("SPECIFIC_RESERVATION", (text,))


def _ip(text: str, flag: str) -> str:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise ConfigError(flag, "expected the server's IP address first") from None
    if not address.is_private:
        raise ConfigError(flag, "the server's IP address must be a private address in your VPC network")
    return text


def _mount_point(text: str, flag: str) -> str:
    if not _MOUNT_POINT.fullmatch(text) or text in (".", ".."):
        raise ConfigError(flag, "MOUNT_POINT is a directory name (mounted under /mnt/nfs or /mnt/lustre)")
    return text


def mounts(ns: argparse.Namespace) -> tuple[tuple[tuple[str, str, str], ...], tuple[tuple[str, str, str, str], ...]]:
    """--nfs-mount and --lustre-mount, checked (mount points unique per kind)."""
    nfs = []
    for text in ns.nfs_mount:
        server, _, rest = text.partition(":")
        path, _, point = rest.rpartition(":")
        if not path.startswith("/"):
            raise ConfigError("--nfs-mount", "expected SERVER:/PATH:MOUNT_POINT, the path absolute")
        nfs.append((_ip(server, "--nfs-mount"), path, _mount_point(point, "--nfs-mount")))
    lustre = []
    for text in ns.lustre_mount:
        parts = text.split(":")
        if len(parts) != 4 or not all(parts):
            raise ConfigError("--lustre-mount", "expected IP:VOLUME_HANDLE:FILESYSTEM:MOUNT_POINT")
        lustre.append((_ip(parts[0], "--lustre-mount"), parts[1], parts[2], _mount_point(parts[3], "--lustre-mount")))
    for flag, points in (("--nfs-mount", [m[2] for m in nfs]), ("--lustre-mount", [m[3] for m in lustre])):
        if len(set(points)) != len(points):
            raise ConfigError(flag, "two mounts at the same MOUNT_POINT")
    return tuple(nfs), tuple(lustre)


def pool_extras(ns: argparse.Namespace, region: str | None) -> tuple[PoolExtras, list[str]]:
    """--env, --boot-disk-*, --reservation, --nfs-mount, --lustre-mount, checked; and warnings."""
    env = parse_pairs(ns.env, "--env", split_commas=False)
    warnings = check_env(env, "--env")
    for flag, size in (("--boot-disk-size", ns.boot_disk_size), ("--evaluator-boot-disk-size",
                                                                ns.evaluator_boot_disk_size),
                       ("--ps-boot-disk-size", ns.ps_boot_disk_size)):
        if size is not None and size < 1:
            raise ConfigError(flag, "must be a size in GB >= 1")
    nfs, lustre = mounts(ns)
    return PoolExtras(tuple(env), ns.boot_disk_type, ns.boot_disk_size, reservation(ns.reservation, region),
                      nfs, lustre), warnings


def evaluator_machines(ns: argparse.Namespace) -> EvaluatorMachines:
    """--evaluator-* (checked with the pools: machines.check_machine_type / check_accelerator)."""
    return EvaluatorMachines(ns.evaluator_machine_type, ns.evaluator_accelerator, ns.evaluator_boot_disk_type,
                             ns.evaluator_boot_disk_size)


def cross_check(settings: JobSettings, extras: PoolExtras) -> list[str]:
    """What the job-wide settings rule out for the pools: reservations with Spot or flex-start VMs, mounts without
    a network. Compute Engine: "You can't consume a reservation to create ... Flex-start VMs; Spot VMs"
    (https://cloud.google.com/compute/docs/instances/reservations-consume)."""
    warnings = []
    kind = extras.reservation[0] if extras.reservation else None
    for flag, given in (("--spot", settings.strategy == "SPOT"), ("--flex-start", settings.strategy == "FLEX_START")):
        if given and kind == "SPECIFIC_RESERVATION":
            raise ConfigError("--reservation", f"{flag} VMs cannot consume a reservation; drop one of them")
        if given and kind == "ANY_RESERVATION":
            warnings.append(f"--reservation any: {flag} VMs never consume a reservation")
    if (extras.nfs_mounts or extras.lustre_mounts) and not (settings.network or settings.psc_network_attachment):
        flag = "--nfs-mount" if extras.nfs_mounts else "--lustre-mount"
        raise ConfigError(flag, "the share is reached over your VPC network: give --network (VPC peering) or "
                          "--psc-network-attachment (Private Service Connect interface)")
    return warnings
