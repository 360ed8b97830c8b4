"""A Vertex AI job as plain data: up to four positional worker pools, and their REST (camelCase) form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from entrypoint.environments.vertex import VERTEX_POOLS

POOL_NAMES = tuple(VERTEX_POOLS)  # workerpool0 (chief), 1 (workers), 2 (ps or reducers), 3 (evaluators)
POOL_ROLES = ("chief", "workers", "parameter servers or Reduction Server", "evaluators")


@dataclass(frozen=True)
class PoolSpec:
    """One worker pool: machines, replicas and the container they run."""

    index: int
    replicas: int
    machine_type: str
    image_uri: str
    accelerator: tuple[str, int] | None = None
    args: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

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
        container: dict[str, Any] = {"imageUri": self.image_uri}
        if self.command:
            container["command"] = list(self.command)
        if self.args:
            container["args"] = list(self.args)
        if self.env:
            container["env"] = [{"name": k, "value": v} for k, v in self.env]
        return {"machineSpec": machine, "replicaCount": self.replicas, "containerSpec": container}


@dataclass(frozen=True)
class JobSpec:
    """A CustomJob: display name, pools by position (None where skipped), base output directory."""

    display_name: str
    pools: tuple[PoolSpec | None, ...]
    base_output_dir: str | None = None

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
        return spec

    def rest_custom_job(self) -> dict[str, Any]:
        """The CustomJob resource the REST API's ``customJobs.create`` takes."""
        return {"displayName": self.display_name, "jobSpec": self.rest_job_spec()}

    def gaps(self) -> list[int]:
        """Indexes of skipped pools before the last one present."""
        last = max(p.index for p in self.present())
        return [i for i in range(last) if self.pool(i) is None]
