"""The framework registry: one line per framework; each framework package declares the rest itself.

A framework package (``entrypoint/pytorch/``, ...) has a light ``framework.py`` (no ML import) whose
``FRAMEWORK`` says what the framework is called, how to tell it is installed, which strategies it
offers, the flags it adds to ``run`` and the variables whose user values beat its defaults, how it
plans a node, and where its launcher and worker live (imported only when run): ``launch(plan, ctx)``
and ``run(plan, ctx)``, with the failure context handed in. The record is also the one home of the facts
the rest of the entrypoint would otherwise hard-code per framework name: the replica roles it serves, GPUs
per process, its loop's DataLoader defaults, the variable its launcher hands a worker its local rank in,
its image and that image's CUDA, the Kubeflow kinds that run it. docs/ARCHITECTURE.md walks through adding one.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from entrypoint.errors import ConfigError
from entrypoint.failures.classify import PeerSigns, add_peer_source

if TYPE_CHECKING:
    from collections.abc import Mapping

    from entrypoint.cluster.topology import ClusterTopology
    from entrypoint.failures import FailureContext
    from entrypoint.options import RunOptions
    from entrypoint.outputs.locations import OutputDirs

# name -> the module holding its FRAMEWORK. Adding a framework is one line here plus its package.
REGISTRY: dict[str, str] = {
    "pytorch": "entrypoint.pytorch.framework",
    "tensorflow": "entrypoint.tensorflow.framework",
    "horovod": "entrypoint.horovod.framework",
    "jax": "entrypoint.jax.framework",
}
ServerPool = Literal["parameter_servers", "reduction_server", "unused"]
Role = Literal["chief", "worker", "ps", "evaluator"]
ROLE_NAMES: dict[str, str] = {"chief": "chiefs", "worker": "workers", "ps": "parameter servers",
                              "evaluator": "evaluators"}


@dataclass(frozen=True)
class NodePlan:
    """What a framework decides for this node: strategy, processes, the server pool's reading, its variables."""

    strategy: str
    reason: str
    nproc_per_node: int
    server_pool: ServerPool | None = None
    env: dict[str, str] = field(default_factory=dict)
    # The chief's peers are servers (ParameterServerStrategy's workers and ps): they serve at once, also when
    # restarted mid-job, and the chief waits until each one listens instead of meeting them at the barrier.
    peers_serve: bool = False
    # The framework's launcher holds the start-up barrier itself (PyTorch: in the job's store), not rendezvous.py.
    own_barrier: bool = False


# topology x options x the user's values of the framework's ``user_variables`` x GPUs x outputs -> NodePlan
Planner = Callable[["ClusterTopology", "RunOptions", "Mapping[str, str]", int, "OutputDirs"], NodePlan]
# launch(plan, ctx) / run(plan, ctx): the node's (or the process's) ``Plan`` and failure ``FailureContext`` -> exit code
Entry = Callable[[Any, "FailureContext"], int]


@dataclass(frozen=True)
class Flag:
    """A command-line flag a framework adds to ``run``; its value reaches the planner as
    ``options.framework_option(name)`` (``--fusion-threshold`` -> ``fusion_threshold``)."""

    flag: str
    help: str
    type: Callable[[str], Any] | None = None
    switch: bool = False  # a flag without a value (store_true)
    choices: tuple[str, ...] | None = None  # the values it accepts, if it is a choice

    # Defaults live with the code that reads the value (``framework_option(name, default)``): a flag not given is
    # absent from the plan, so a job of another framework carries none of it.

    @property
    def name(self) -> str:
        """The option's name in ``RunOptions.framework_options``."""
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class DataLoaderDefaults:
    """DataLoader workers per process: what the framework's hooks loop starts on GPU and on CPU when
    ``--data-workers`` is not given, and what a script of that framework is assumed to start (``doctor``)."""

    gpu: int = 2
    cpu: int = 0
    script: int = 1

    def workers(self, cuda: bool) -> int:
        """The hooks loop's default on a GPU (``cuda``) or on CPU."""
        return self.gpu if cuda else self.cpu


@dataclass(frozen=True)
class Framework:
    """One framework, as the rest of the entrypoint sees it."""

    name: str
    probe: str  # a module whose presence (found, never imported) means the framework is installed
    strategies: tuple[str, ...]  # what --strategy accepts for it
    plan: Planner  # -> NodePlan (or ConfigError); imports nothing heavy
    launcher: str  # "module:function": launch(plan, ctx) for the node -> its exit code; imported only to run
    worker: str | None = None  # "module:function": run(plan, ctx) for one placed process -> its exit code
    flags: tuple[Flag, ...] = ()  # its own flags of ``run`` (shown in a group named after it)
    user_variables: tuple[str, ...] = ()  # variables it sets defaults for; the user's values (read for it) win
    title: str = ""  # how people write it ("TensorFlow"); the name where empty
    roles: tuple[Role, ...] = ("chief", "worker")  # the replicas it serves (ps, evaluators: ParameterServerStrategy)
    gpus_per_process: Literal["one", "all"] = "one"  # one process per GPU, or one process driving every GPU
    data_loader: DataLoaderDefaults | None = None  # its hooks loop's DataLoader workers (None: it starts none)
    cpu_collectives: str | None = None  # the backend between processes without GPUs ("gloo"), if it is ours to set
    local_rank_variable: str | None = None  # where its launcher hands each worker process its local rank
    prefixed_output: bool = False  # its launcher prints each process's lines behind a prefix (no JSON lines)
    chosen_alone: bool = True  # "the one installed" when --framework is not given (Horovod rides on torch: no)
    image: str | None = None  # its image, images/<image>/Dockerfile (``.../<image>:tag``, ``<image>-cpu``)
    cuda_major: int | None = None  # the CUDA major version its GPU image is built on (docs/images.md)
    kubeflow_kinds: tuple[str, ...] = ()  # job kubeflow --kind values that run it, the first one the default
    # Its hooks loop's collectives form again among the survivors of a lost node, who keep training
    # (``--recovery in-place``; torch.distributed's do, Horovod's need Horovod's own elastic mode).
    survivors_regroup: bool = False
    # Its hooks loop takes the model's first weights from --init-from (a Hugging Face safetensors checkpoint).
    init_from: bool = False
    # Whether its hooks loop keeps FSDP's snapshots in peer memory for a plan (``doctor`` sizes their host memory):
    # "fsdp" (``--strategy fsdp``), "fsdp by size" (where FSDP is chosen by the model's size), None where it does not.
    peer_snapshots: Callable[[Any], str | None] | None = None

    @property
    def label(self) -> str:
        """The framework as people write it: ``TensorFlow``, ``PyTorch``."""
        return self.title or self.name
    # How its lost peer shows (failures.classify: retryable 129, not the user's permanent 1): its exception types
    # ("torch.distributed.DistNetworkError": name and top package), and the modules where its collectives and store
    # run (a RuntimeError or OSError raised there that names a connection or a timeout).
    peer_errors: tuple[str, ...] = ()
    peer_modules: tuple[str, ...] = ()
    peer_messages: tuple[str, ...] = ()  # what its own errors say then, beside the transports' words (lower case)

    def installed(self) -> bool:
        """Whether the framework's module can be found (nothing is imported)."""
        return importlib.util.find_spec(self.probe) is not None

    def load_launcher(self) -> Entry:
        """``launch(plan, ctx)`` for the node's ``Plan`` (imports the framework's launch module)."""
        return _load(self.launcher)

    def load_worker(self) -> Entry:
        """``run(plan, ctx)`` for a placed process's ``Plan`` (imports the framework's worker module)."""
        if self.worker is None:
            raise AssertionError(f"{self.name} runs no separate worker processes")
        return _load(self.worker)


def _load(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def peer_signs() -> Iterator[PeerSigns]:
    """Every registered framework's signs of a lost peer (``failures.classify`` asks when it classifies)."""
    for name in list(REGISTRY):
        try:
            framework = get(name)
        except Exception:  # a registry line whose package is missing: it names no peer error
            continue
        yield PeerSigns(framework.peer_errors, framework.peer_modules, framework.peer_messages)


add_peer_source(peer_signs)


def names() -> tuple[str, ...]:
    """Every registered framework name."""
    return tuple(REGISTRY)


@cache
def get(name: str) -> Framework:
    """The registered framework ``name`` (KeyError for an unknown one; callers validate names first)."""
    framework: Framework = importlib.import_module(REGISTRY[name]).FRAMEWORK
    return framework


def owner_of(option: str) -> tuple[Framework, Flag] | None:
    """The framework whose own flag ``option`` is (by its name in ``framework_options``), and the flag."""
    for name in REGISTRY:
        for flag in get(name).flags:
            if flag.name == option:
                return get(name), flag
    return None


def installed_here() -> tuple[str, ...]:
    """The registered frameworks this Python can import (found, not imported)."""
    return tuple(name for name in REGISTRY if get(name).installed())


def where_installed(framework: Framework) -> str:
    """Where ``framework`` is installed: its image, and the environment of a checkout (the Makefile's venvs)."""
    if framework.image is None:
        return f"install it here (its module {framework.probe!r})"
    venv = f".venv/{framework.image}"
    return (f"run in the {framework.image} image, or on a checkout in {venv} (make venv-{framework.image}, then "
            f". {venv}/bin/activate)")


def require_installed(framework: Framework, source: str, script: bool = False) -> str | None:
    """A framework this Python cannot import is a configuration error saying where it is installed (``run``: a
    plain interpreter would otherwise fail inside the launcher's first import, as the user's code). A script runs as
    it is (it may need nothing of the framework: the launcher only sets its variables): then the same words come
    back as a warning to log."""
    if framework.installed():
        return None
    here = ", ".join(installed_here()) or "none"
    why = (f"{framework.name} is not installed in this Python ({sys.executable}; installed here: {here}): "
           f"{where_installed(framework)}")
    if script:
        return f"{source}: {why}; the script runs as it is (an import of {framework.probe} in it will fail)"
    raise ConfigError(source, why)


def serving(role: str) -> tuple[Framework, ...]:
    """The registered frameworks whose replicas include ``role`` (``ps``: ParameterServerStrategy's)."""
    return tuple(get(name) for name in REGISTRY if role in get(name).roles)


def role_refusal(framework: Framework, role: str) -> str | None:
    """Why ``framework`` cannot serve a ``role`` replica (``evaluators are TensorFlow only, not pytorch``), or None."""
    if role in framework.roles:
        return None
    others = " and ".join(f.label for f in serving(role)) or "no framework"
    return f"{ROLE_NAMES.get(role, role)} are {others} only, not {framework.name}"


def local_rank_variables() -> tuple[str, ...]:
    """Every variable a registered framework's launcher hands its workers their local rank in, in registry order."""
    found = (get(name).local_rank_variable for name in REGISTRY)
    return tuple(dict.fromkeys(v for v in found if v))


def by_image(image_name: str) -> Framework | None:
    """The framework whose image ``image_name`` is (``pytorch``, or a variant of it: ``pytorch-cpu``)."""
    for name in REGISTRY:
        image = get(name).image
        if image and (image_name == image or image_name.startswith(image + "-")):
            return get(name)
    return None


def all_strategies() -> tuple[str, ...]:
    """Every strategy any framework accepts, in registry order, without repeats."""
    seen: dict[str, None] = {}
    for name in REGISTRY:
        seen.update(dict.fromkeys(get(name).strategies))
    return tuple(seen)
