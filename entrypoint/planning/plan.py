"""The plan: framework x topology x GPUs -> strategy, processes, outputs, user code, emitted variables.

The plan is made once per node (``make_plan``) and is the one thing every process of the node receives:
the launcher writes it to a private file (``handoff``) and each worker reads it back, placing itself
with ``for_process`` (``placement.place``). Nothing downstream re-reads the platform's variables.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments.settings import PlatformSettings
from entrypoint.cluster.placement import Placement, job_world_size, place
from entrypoint.cluster.topology import ClusterTopology
from entrypoint.errors import ConfigError
from entrypoint.options import RunOptions
from entrypoint.outputs.locations import OutputDirs, resolve_outputs
from entrypoint.outputs.sbom import ImageIdentity, identify
from entrypoint.planning import registry
from entrypoint.planning.registry import ServerPool
from entrypoint.planning.usercode import UserCode, find_code


@dataclass(frozen=True)
class Plan:
    """What ``run`` does on this node (and, once placed with ``for_process``, in this process).

    ``placement`` is None in the node's plan and set in a process's plan; a platform that started this process
    itself (torchrun, mpirun) placed it already, so ``make_plan`` places it at once.
    """

    framework: str
    strategy: str
    reason: str
    nproc_per_node: int
    gpus_per_node: int
    world_size: int
    outputs: OutputDirs
    topology: ClusterTopology
    options: RunOptions
    code: UserCode | None = None
    server_pool: ServerPool | None = None
    framework_env: tuple[tuple[str, str], ...] = ()
    peers_serve: bool = False  # the chief's peers are servers: no barrier, the chief waits until they listen
    restart_count: int = 0  # the platform's restarts of this replica (TRAINER_RESTART_COUNT)
    own_barrier: bool = False
    placement: Placement | None = None
    image: ImageIdentity = field(default_factory=ImageIdentity)  # the image: the reference its spec passed, its SBOM

    def for_process(self, local_rank: int) -> Plan:
        """This node's plan as seen by its ``local_rank``-th process."""
        return replace(self, placement=place(self.topology, self.nproc_per_node, local_rank))

    def only_process(self) -> Plan:
        """The plan of the node's one process: as the platform placed it (torchrun, mpirun), else local rank 0."""
        return self if self.placement is not None else self.for_process(0)

    @property
    def placed(self) -> Placement:
        """This process's placement (a node's plan is placed by ``for_process`` before any training runs)."""
        if self.placement is None:
            raise AssertionError("the node's plan was used as a process's plan: call for_process first")
        return self.placement

    def loader_workers(self, cuda: bool) -> int:
        """DataLoader workers per process when ``--data-workers`` is not given: the framework's loop default."""
        loader = registry.get(self.framework).data_loader
        return loader.workers(cuda) if loader is not None else 0

    def require_code(self) -> UserCode:
        """The user's code, which ``run`` needs (``describe`` does not)."""
        if self.code is None:
            raise ConfigError("--module", f"no user code: pass --module MOD or --script FILE (or set "
                              f"{ev.TRAINER_MODULE})")
        return self.code

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
        tf_config = topo.tf_config_json(include_servers=self.server_pool == "parameter_servers")
        if tf_config is not None:
            env[ev.TF_CONFIG] = tf_config
        if not topo.processes_started_externally:
            env.update(topo.torch_env())
        env.update(self.framework_env)
        return env

    def describe(self) -> dict[str, Any]:
        """JSON-ready view (what ``describe`` prints and the plan file holds)."""
        return {
            "framework": self.framework, "strategy": self.strategy, "reason": self.reason,
            "nproc_per_node": self.nproc_per_node, "gpus_per_node": self.gpus_per_node,
            "world_size": self.world_size, "job_dir": self.outputs.job_dir, "model_dir": self.outputs.model_dir,
            "checkpoint_dir": self.outputs.checkpoint_dir, "tensorboard_dir": self.outputs.tensorboard_dir,
            "server_pool": self.server_pool, "code": asdict(self.code) if self.code else None,
            "timeout": self.options.timeout, "grace_period": self.options.grace_period,
            "hang_timeout": self.options.hang_timeout, "startup_timeout": self.options.startup_timeout,
            "image": self.image.to_dict(),
        }

    def to_dict(self) -> dict[str, Any]:
        """Everything, for the plan file."""
        data = {f: getattr(self, f) for f in self.__dataclass_fields__}
        data.update(topology=self.topology.to_dict(), options=self.options.to_dict(), outputs=asdict(self.outputs),
                    code=asdict(self.code) if self.code else None,
                    placement=asdict(self.placement) if self.placement else None, image=self.image.to_dict())
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """Inverse of ``to_dict``."""
        return cls(**{
            **data,
            "topology": ClusterTopology.from_dict(data["topology"]),
            "options": RunOptions.from_dict(data["options"]),
            "outputs": OutputDirs(**data["outputs"]),
            "code": UserCode(**data["code"]) if data.get("code") else None,
            "framework_env": tuple(tuple(pair) for pair in data.get("framework_env", ())),
            "placement": Placement(**data["placement"]) if data.get("placement") else None,
            "image": ImageIdentity(**data.get("image") or {}),
        })


def choose_framework(requested: str | None, settings: PlatformSettings) -> str:
    """--framework, else $TRAINER_FRAMEWORK, else the one framework installed."""
    name = requested or settings.framework
    accepted = ", ".join(registry.names())
    if name is not None:
        if name not in registry.names():
            raise ConfigError(ev.TRAINER_FRAMEWORK, f"unknown framework {name!r}; expected one of {accepted}")
        return name
    # A framework that rides on another (Horovod on torch) is never "the one installed": name it explicitly.
    candidates = [n for n in registry.names() if registry.get(n).chosen_alone]
    installed = [n for n in candidates if registry.get(n).installed()]
    if len(installed) == 1:
        return installed[0]
    if installed:
        raise ConfigError("--framework", f"not given and {' and '.join(installed)} are all installed; pass one of "
                          f"{accepted}")
    images = [image for name in candidates if (image := registry.get(name).image)]
    raise ConfigError("--framework", f"not given and no framework is installed in this Python ({sys.executable}): "
                      f"run in a trainer image ({', '.join(images)}), or on a checkout in a framework's environment: "
                      ".venv/IMAGE (make venv-IMAGE, then . .venv/IMAGE/bin/activate)")


def cpu_share(settings: PlatformSettings, topo: ClusterTopology, nproc: int) -> dict[str, str]:
    """OMP_NUM_THREADS for each of the node's processes when the replica's CPUs are known (TRAINER_CPUS): its share,
    at least 1. Without it every process of every replica `local` runs on one host starts an OpenMP pool as wide as
    the host, and the pools spin against each other (measured: 4x the CPU and 4x the time of a two-replica job on two
    busy cores). Not where the user set OMP_NUM_THREADS, a framework sets its own (torchrun's 1 for several processes
    a node), or the platform started the processes (their pools exist already)."""
    if settings.cpus is None or topo.processes_started_externally or settings.user_values((ev.OMP_NUM_THREADS,)):
        return {}
    return {ev.OMP_NUM_THREADS: str(max(1, settings.cpus // max(1, nproc)))}


def make_plan(topo: ClusterTopology, options: RunOptions, settings: PlatformSettings, gpus: int) -> Plan:
    """Decide strategy, processes per node, outputs and user code; ConfigError for impossible combinations."""
    framework = registry.get(choose_framework(options.framework, settings))
    if options.strategy is not None and options.strategy not in framework.strategies:
        raise ConfigError("--strategy", f"{options.strategy} is not available with {framework.name}; expected one "
                          f"of {', '.join(framework.strategies)}")
    outputs = resolve_outputs(
        job_dir=options.job_dir or settings.job_dir,
        model_dir=options.model_dir or settings.model_dir,
        checkpoint_dir=options.checkpoint_dir or settings.checkpoint_dir,
        tensorboard_dir=options.tensorboard_dir or settings.tensorboard_dir,
        trial=topo.trial,
    )
    for option, _value in options.framework_options:  # another framework's flag would do nothing here
        owner = registry.owner_of(option)
        if owner is not None and owner[0].name != framework.name:
            raise ConfigError(owner[1].flag, f"is a {owner[0].name} option and this job runs {framework.name}")
    _check_role(framework, topo)
    unknown = set(framework.user_variables) - set(ev.FRAMEWORK_DEFAULTED)
    assert not unknown, f"{framework.name} declares user variables outside envvars.FRAMEWORK_DEFAULTED: {unknown}"
    node = framework.plan(topo, options, settings.user_values(framework.user_variables), gpus, outputs)
    env = {**cpu_share(settings, topo, node.nproc_per_node), **node.env}
    made = Plan(
        framework=framework.name, strategy=node.strategy, reason=node.reason, nproc_per_node=node.nproc_per_node,
        gpus_per_node=gpus, world_size=job_world_size(topo, node.nproc_per_node), outputs=outputs, topology=topo,
        options=options,
        code=find_code(options.module or settings.module, options.script), server_pool=node.server_pool,
        framework_env=tuple(sorted(env.items())), peers_serve=node.peers_serve,
        restart_count=settings.restart_count,
        own_barrier=node.own_barrier, image=identify(settings.image, settings.sbom),
    )
    _check_init_from(framework, made)
    if topo.platform_ranks is not None:  # the platform started this very process: it is placed already
        return made.for_process(topo.platform_ranks.local_rank)
    return made


def _check_init_from(framework: registry.Framework, plan: Plan) -> None:
    """``--init-from`` is read by a hooks loop that loads it (PyTorch's); anywhere else it would do nothing."""
    if plan.options.init_from is None:
        return
    if not framework.init_from:
        raise ConfigError("--init-from", f"is read by the PyTorch hooks loop; {framework.label} loads its own weights "
                                         "(in build_model)")
    if plan.code is None or plan.code.kind != "hooks":
        raise ConfigError("--init-from", "is read by the hooks loop (a --module with build_model); a script or plain "
                                         "module loads its own weights")


def _check_role(framework: registry.Framework, topo: ClusterTopology) -> None:
    """A replica in a role the framework does not serve (a PyTorch evaluator) is a configuration error."""
    why = registry.role_refusal(framework, topo.role)
    if why is None:
        return
    variable = ev.TF_CONFIG if topo.source == "tf_config" else ev.CLUSTER_SPEC
    if topo.role == "ps" and topo.source == "vertex":
        why += (f": workerpool2 of a {framework.name} job is a Reduction Server; run Google's reductionserver image "
                "there, not this one")
    raise ConfigError(variable, why, "task.type")
