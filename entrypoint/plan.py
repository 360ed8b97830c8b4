"""The plan: framework x topology x GPUs -> strategy, processes per node, outputs, emitted variables."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Literal

from entrypoint import envvars as ev
from entrypoint.environments.settings import PlatformSettings
from entrypoint.errors import ConfigError
from entrypoint.options import FRAMEWORKS, RunOptions
from entrypoint.outputs import OutputDirs, resolve_outputs
from entrypoint.topology import ClusterTopology

ServerPool = Literal["parameter_servers", "reduction_server", "unused"]
# Importable module that proves a framework is installed (checked with find_spec: nothing imported).
_FRAMEWORK_PROBES = {"pytorch": "torch", "tensorflow": "tensorflow"}
HOROVOD_FUSION_THRESHOLD_DEFAULT = 134217728  # 128 MiB, Vertex's Reduction Server recommendation
HOROVOD_CYCLE_TIME_DEFAULT_MS = 5.0


@dataclass(frozen=True)
class Plan:
    """What ``run`` will do on this replica."""

    framework: str
    strategy: str
    reason: str
    nproc_per_node: int
    gpus_per_node: int
    world_size: int
    outputs: OutputDirs
    server_pool: ServerPool | None
    topology: ClusterTopology
    framework_env: tuple[tuple[str, str], ...] = ()

    @property
    def tf_includes_servers(self) -> bool:
        """Whether TF_CONFIG lists the ps pool (only when it is read as parameter servers)."""
        return self.server_pool == "parameter_servers"

    def emitted_env(self) -> dict[str, str]:
        """Variables the entrypoint sets for the processes it starts (shown by ``describe``)."""
        topo = self.topology
        env: dict[str, str] = {
            ev.AIP_MODEL_DIR: self.outputs.model_dir,
            ev.AIP_CHECKPOINT_DIR: self.outputs.checkpoint_dir,
            ev.AIP_TENSORBOARD_LOG_DIR: self.outputs.tensorboard_dir,
        }
        if topo.trial is not None:
            env[ev.CLOUD_ML_TRIAL_ID] = topo.trial
        tf_config = topo.tf_config_json(include_servers=self.tf_includes_servers)
        if tf_config is not None:
            env[ev.TF_CONFIG] = tf_config
        if not topo.per_process:
            env.update(topo.torch_env())
        env.update(self.framework_env)
        return env

    def describe(self) -> dict[str, Any]:
        """JSON-ready view (DESIGN.md's ``plan`` keys plus a few more)."""
        return {
            "framework": self.framework,
            "strategy": self.strategy,
            "reason": self.reason,
            "nproc_per_node": self.nproc_per_node,
            "gpus_per_node": self.gpus_per_node,
            "world_size": self.world_size,
            "job_dir": self.outputs.job_dir,
            "model_dir": self.outputs.model_dir,
            "checkpoint_dir": self.outputs.checkpoint_dir,
            "tensorboard_dir": self.outputs.tensorboard_dir,
            "server_pool": self.server_pool,
        }


def horovod_tuning_env(options: RunOptions, user_set: dict[str, str], job_dir: str) -> dict[str, str]:
    """HOROVOD_FUSION_THRESHOLD / CYCLE_TIME (/ AUTOTUNE) for the workers; variables the user set always win."""
    threshold = options.fusion_threshold if options.fusion_threshold is not None else HOROVOD_FUSION_THRESHOLD_DEFAULT
    cycle = options.cycle_time_ms if options.cycle_time_ms is not None else HOROVOD_CYCLE_TIME_DEFAULT_MS
    env = {ev.HOROVOD_FUSION_THRESHOLD: str(threshold), ev.HOROVOD_CYCLE_TIME: f"{cycle:g}"}
    if options.autotune:
        env[ev.HOROVOD_AUTOTUNE] = "1"
        env[ev.HOROVOD_AUTOTUNE_LOG] = f"{job_dir.rstrip('/')}/horovod_autotune.csv"
    env.update(user_set)
    return env


def choose_framework(requested: str | None, settings: PlatformSettings) -> str:
    """--framework, else $TRAINER_FRAMEWORK, else the one framework installed."""
    name = requested or settings.framework
    if name is not None:
        if name not in FRAMEWORKS:
            accepted = ", ".join(FRAMEWORKS)
            raise ConfigError(ev.TRAINER_FRAMEWORK, f"unknown framework {name!r}; expected one of {accepted}")
        return name
    installed = [fw for fw, probe in _FRAMEWORK_PROBES.items() if importlib.util.find_spec(probe) is not None]
    if len(installed) == 1:
        return installed[0]
    what = "both torch and tensorflow are installed" if installed else "neither torch nor tensorflow is installed"
    raise ConfigError("--framework", f"not given and {what}; pass one of {', '.join(FRAMEWORKS)}")


def _tensorflow_strategy(topo: ClusterTopology, forced: str | None, gpus: int) -> tuple[str, str]:
    if forced is not None:
        allowed = ("default", "OneDeviceStrategy", "MirroredStrategy", "MultiWorkerMirroredStrategy",
                   "ParameterServerStrategy")
        if forced not in allowed:
            accepted = ", ".join(allowed)
            raise ConfigError("--strategy", f"{forced} is not a TensorFlow strategy; expected one of {accepted}")
        if forced == "ParameterServerStrategy" and not topo.servers:
            raise ConfigError("--strategy", "ParameterServerStrategy needs a ps pool (Vertex workerpool2)")
        if forced in ("default", "OneDeviceStrategy", "MirroredStrategy") and topo.num_nodes > 1:
            raise ConfigError("--strategy", f"{forced} is single-node but there are {topo.num_nodes} training nodes")
        return forced, "forced by --strategy"
    if topo.servers:
        return "ParameterServerStrategy", f"a parameter-server pool of {len(topo.servers)} is present"
    if topo.num_nodes > 1:
        return "MultiWorkerMirroredStrategy", f"{topo.num_nodes} training nodes"
    if gpus > 1:
        return "MirroredStrategy", f"one node with {gpus} GPUs"
    return "default", "one node with at most one GPU"


def make_plan(
    topo: ClusterTopology, options: RunOptions, settings: PlatformSettings, gpus: int
) -> Plan:
    """Decide strategy, processes per node and outputs; raise ConfigError for impossible combinations."""
    framework = choose_framework(options.framework, settings)
    outputs = resolve_outputs(
        job_dir=options.job_dir or settings.job_dir,
        model_dir=options.model_dir or settings.model_dir,
        checkpoint_dir=options.checkpoint_dir or settings.checkpoint_dir,
        tensorboard_dir=options.tensorboard_dir or settings.tensorboard_dir,
        trial=topo.trial,
    )
    server_pool: ServerPool | None = None
    if framework == "tensorflow":
        strategy, reason = _tensorflow_strategy(topo, options.strategy, gpus)
        if options.nproc_per_node not in (None, 1):
            raise ConfigError("--nproc-per-node", "TensorFlow runs one process per node (it drives every GPU itself)")
        nproc = 1
        if topo.servers:
            server_pool = "parameter_servers" if strategy == "ParameterServerStrategy" else "reduction_server"
        if topo.role == "ps" and server_pool == "reduction_server":
            raise ConfigError(ev.CLUSTER_SPEC, f"this replica is in the server pool, which is a Reduction Server with "
                              f"{strategy}: run Google's reductionserver image in workerpool2, not this one",
                              "task.type")
    else:
        expected = "ddp" if framework == "pytorch" else "horovod"
        if options.strategy not in (None, expected, "default"):
            raise ConfigError("--strategy", f"{options.strategy} is not available with {framework}; use {expected}")
        if topo.servers:
            server_pool = "reduction_server" if topo.source == "vertex" else "unused"
        variable = ev.TF_CONFIG if topo.source == "tf_config" else ev.CLUSTER_SPEC
        if topo.role == "ps":
            raise ConfigError(
                variable, f"this replica is in the server pool, which is a Reduction Server for {framework}: "
                "run Google's reductionserver image in workerpool2, not this one", "task.type")
        if topo.role == "evaluator":
            raise ConfigError(variable, f"evaluator replicas are supported with tensorflow, not {framework}",
                              "task.type")
        if topo.per_process:
            assert topo.process is not None
            nproc = topo.process.local_world_size
        else:
            nproc = options.nproc_per_node or topo.nproc_per_node or max(gpus, 1)
        strategy = expected
        reason = "one process per GPU" if gpus else "one process per node on CPU (gloo)"
        if options.nproc_per_node:
            reason = "--nproc-per-node"
    world = topo.process.world_size if topo.process is not None else topo.num_nodes * nproc
    if framework == "pytorch" and world == 1 and options.strategy is None:
        strategy, reason = "default", "a single process"
    framework_env: dict[str, str] = {}
    if framework == "horovod":
        framework_env = horovod_tuning_env(options, dict(settings.horovod_tuning), outputs.job_dir)
    if framework in ("tensorflow", "horovod"):
        # tf-keras (Keras 2) ships with TensorFlow in our images: Keras 3's fit fails under
        # MultiWorkerMirroredStrategy and horovod.tensorflow.keras needs Keras 2. The user's value wins.
        framework_env[ev.TF_USE_LEGACY_KERAS] = settings.tf_use_legacy_keras or "1"
    return Plan(
        framework=framework, strategy=strategy, reason=reason, nproc_per_node=nproc, gpus_per_node=gpus,
        world_size=world, outputs=outputs, server_pool=server_pool, topology=topo,
        framework_env=tuple(sorted(framework_env.items())),
    )
