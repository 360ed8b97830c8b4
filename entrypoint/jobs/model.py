"""A Vertex AI job as plain data: up to four positional worker pools, job-wide settings, their REST (camelCase) form."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from entrypoint.cluster.environments.vertex import VERTEX_POOLS

POOL_NAMES = tuple(VERTEX_POOLS)  # workerpool0 (chief), 1 (workers), 2 (ps or reducers), 3 (evaluators)
POOL_ROLES = ("chief", "workers", "parameter servers or Reduction Server", "evaluators")
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
NFS_FIELDS = ("server", "path", "mountPoint")
LUSTRE_FIELDS = ("instanceIp", "volumeHandle", "filesystem", "mountPoint")


@dataclass(frozen=True)
class PoolSpec:
    """One worker pool: machines, replicas, boot disk, reservation and the container they run."""

    index: int
    replicas: int
    machine_type: str
    image_uri: str
    accelerator: tuple[str, int] | None = None
    args: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    disk_type: str | None = None
    disk_size_gb: int | None = None
    reservation: tuple[str, tuple[str, ...]] | None = None  # (reservationAffinityType, values)
    nfs_mounts: tuple[tuple[str, str, str], ...] = ()  # (server, path, mountPoint): /mnt/nfs/<mountPoint>
    lustre_mounts: tuple[tuple[str, str, str, str], ...] = ()  # (instanceIp, volumeHandle, filesystem, mountPoint)

    @property
    def name(self) -> str:
        """``workerpool0`` .. ``workerpool3``."""
        return POOL_NAMES[self.index]

    def machine_text(self) -> str:
        """``n1-standard-8 with 2 x NVIDIA_TESLA_T4`` (or the machine type alone)."""
        if self.accelerator is None:
            return self.machine_type
        return f"{self.machine_type} with {self.accelerator[1]} x {self.accelerator[0]}"

    def to_rest(self) -> dict[str, Any]:
        """The WorkerPoolSpec as the REST API takes it."""
        machine: dict[str, Any] = {"machineType": self.machine_type}
        if self.accelerator is not None:
            machine["acceleratorType"], machine["acceleratorCount"] = self.accelerator
        if self.reservation is not None:
            kind, values = self.reservation
            machine["reservationAffinity"] = {"reservationAffinityType": kind}
            if values:
                machine["reservationAffinity"].update({"key": RESERVATION_KEY, "values": list(values)})
        container: dict[str, Any] = {"imageUri": self.image_uri}
        if self.command:
            container["command"] = list(self.command)
        if self.args:
            container["args"] = list(self.args)
        if self.env:
            container["env"] = [{"name": k, "value": v} for k, v in self.env]
        pool: dict[str, Any] = {"machineSpec": machine, "replicaCount": self.replicas, "containerSpec": container}
        if self.nfs_mounts:
            pool["nfsMounts"] = [dict(zip(NFS_FIELDS, m, strict=True)) for m in self.nfs_mounts]
        if self.lustre_mounts:
            pool["lustreMounts"] = [dict(zip(LUSTRE_FIELDS, m, strict=True)) for m in self.lustre_mounts]
        disk = {k: v for k, v in (("bootDiskType", self.disk_type), ("bootDiskSizeGb", self.disk_size_gb)) if v}
        if disk:
            pool["diskSpec"] = disk
        return pool


@dataclass(frozen=True)
class JobSettings:
    """Job-wide options: scheduling, identity and network (CustomJobSpec), labels and CMEK (CustomJob)."""

    timeout_s: int | None = None
    max_wait_s: int | None = None
    strategy: str | None = None  # Scheduling.Strategy: SPOT, FLEX_START, STANDARD
    restart_job_on_worker_restart: bool = False
    disable_retries: bool = False
    service_account: str | None = None
    network: str | None = None
    reserved_ip_ranges: tuple[str, ...] = ()
    enable_web_access: bool = False
    tensorboard: str | None = None
    persistent_resource_id: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    kms_key: str | None = None
    psc_network_attachment: str | None = None  # pscInterfaceConfig.networkAttachment
    psc_dns_peering: tuple[tuple[str, str, str], ...] = ()  # (domain, targetProject, targetNetwork)
    experiment: str | None = None  # the Experiment's full resource name
    experiment_run: str | None = None  # ... and its run's
    enable_dashboard_access: bool = False

    def rest_scheduling(self) -> dict[str, Any]:
        """Scheduling, camelCase; durations as proto JSON writes them (``3600s``)."""
        items: list[tuple[str, Any]] = [
            ("timeout", f"{self.timeout_s}s" if self.timeout_s is not None else None),
            ("restartJobOnWorkerRestart", self.restart_job_on_worker_restart or None),
            ("strategy", self.strategy),
            ("disableRetries", self.disable_retries or None),
            ("maxWaitDuration", f"{self.max_wait_s}s" if self.max_wait_s is not None else None),
        ]
        return {k: v for k, v in items if v is not None}

    def rest_spec_fields(self) -> dict[str, Any]:
        """The CustomJobSpec fields these settings fill."""
        items: list[tuple[str, Any]] = [
            ("persistentResourceId", self.persistent_resource_id),
            ("scheduling", self.rest_scheduling() or None),
            ("serviceAccount", self.service_account),
            ("network", self.network),
            ("reservedIpRanges", list(self.reserved_ip_ranges) or None),
            ("tensorboard", self.tensorboard),
            ("enableWebAccess", self.enable_web_access or None),
            ("pscInterfaceConfig", self.rest_psc()),
            ("experiment", self.experiment),
            ("experimentRun", self.experiment_run),
            ("enableDashboardAccess", self.enable_dashboard_access or None),
        ]
        return {k: v for k, v in items if v is not None}

    def rest_psc(self) -> dict[str, Any] | None:
        """PscInterfaceConfig, camelCase (None without a network attachment)."""
        if self.psc_network_attachment is None:
            return None
        out: dict[str, Any] = {"networkAttachment": self.psc_network_attachment}
        if self.psc_dns_peering:
            out["dnsPeeringConfigs"] = [{"domain": d, "targetProject": p, "targetNetwork": n}
                                        for d, p, n in self.psc_dns_peering]
        return out

    def rest_resource_fields(self) -> dict[str, Any]:
        """The fields of the resource itself (CustomJob, HyperparameterTuningJob): labels and encryptionSpec."""
        out: dict[str, Any] = {}
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.kms_key:
            out["encryptionSpec"] = {"kmsKeyName": self.kms_key}
        return out


@dataclass(frozen=True)
class JobSpec:
    """A CustomJob: display name, pools by position (None where skipped), base output directory, settings."""

    display_name: str
    pools: tuple[PoolSpec | None, ...]
    base_output_dir: str | None = None
    settings: JobSettings = field(default_factory=JobSettings)

    def pool(self, index: int) -> PoolSpec | None:
        """The pool at ``index`` (None when absent or skipped)."""
        return self.pools[index] if index < len(self.pools) else None

    def present(self) -> list[PoolSpec]:
        """The pools that exist, in order."""
        return [p for p in self.pools if p is not None]

    def rest_pools(self) -> list[dict[str, Any]]:
        """workerPoolSpecs: skipped pools in between are ``{}`` (Vertex reads pools by position)."""
        last = max(p.index for p in self.present())
        return [p.to_rest() if p is not None else {} for p in self.pools[: last + 1]]

    def rest_job_spec(self) -> dict[str, Any]:
        """The CustomJobSpec (what ``gcloud ai custom-jobs create --config`` takes)."""
        spec: dict[str, Any] = {"workerPoolSpecs": self.rest_pools()}
        if self.base_output_dir:
            spec["baseOutputDirectory"] = {"outputUriPrefix": self.base_output_dir}
        spec.update(self.settings.rest_spec_fields())
        return spec

    def rest_custom_job(self) -> dict[str, Any]:
        """The CustomJob resource the REST API's ``customJobs.create`` takes."""
        return {"displayName": self.display_name, "jobSpec": self.rest_job_spec(),
                **self.settings.rest_resource_fields()}

    def gaps(self) -> list[int]:
        """Indexes of skipped pools before the last one present."""
        last = max(p.index for p in self.present())
        return [i for i in range(last) if self.pool(i) is None]
