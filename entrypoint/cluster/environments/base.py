"""The small abstract base every cluster-environment format implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments._parse import get_trial
from entrypoint.cluster.topology import ClusterTopology, Source


class ClusterEnvironment(ABC):
    """One cluster-environment format: ``detect`` says whether it applies, ``topology`` parses it."""

    source: ClassVar[Source]
    # The platform started one process per GPU itself (torchrun, mpirun): its ranks are the placement, and
    # nothing may spawn again. Such a format puts the ranks it read on the topology (``platform_ranks``).
    creates_processes_externally: ClassVar[bool] = False

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ

    @staticmethod
    @abstractmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """Whether this format's variables are present (cheap; never raises)."""

    @abstractmethod
    def topology(self) -> ClusterTopology:
        """Parse the variables into a topology, or raise ConfigError naming what is wrong."""

    def platform_trial(self) -> str | None:
        """The tuning trial id the platform exported on its own (CLOUD_ML_TRIAL_ID)."""
        raw = self._environ.get(ev.CLOUD_ML_TRIAL_ID)
        return get_trial(ev.CLOUD_ML_TRIAL_ID, {"trial": raw}, "") if raw is not None else None
