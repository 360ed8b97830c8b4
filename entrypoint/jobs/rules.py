"""What makes a job invalid before it costs anything: pool layout, framework rules, machines.

Shared by ``job vertex`` (checking what it built) and ``local --spec`` (checking what it was given).
Errors are ConfigError (one line, exit 2); what is merely unwise comes back as warnings.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import NoReturn

from entrypoint.errors import ConfigError
from entrypoint.jobs import machines, network
from entrypoint.jobs.model import JobSpec, PoolSpec
from entrypoint.planning import registry
from entrypoint.planning.runargs import add_run_arguments

# argparse names a failed conversion by its function: say what the value must be instead.
_TYPE_WORDS = {"int": "a whole number", "float": "a number", "positive_int": "a whole number >= 1",
               "non_negative_int": "a whole number >= 0", "positive_float": "a number > 0",
               "non_negative_float": "a number >= 0"}


def readable(message: str) -> str:
    """An argparse error without values (they may be secrets) or internal names: what is wrong, by option."""
    message = re.sub(r"invalid (\w+) value(: '.*?')?",
                     lambda m: f"expects {_TYPE_WORDS.get(m[1], m[1].strip('_').replace('_', ' '))}", message)
    message = re.sub(r"invalid choice: '.*?' \(choose from (.*)\)", r"expects one of \1", message)
    message = re.sub(r"(value|choice): '.*?'", r"\1", message)
    return re.sub(r", got .*$", "", message)  # ArgumentTypeError texts end with the value


class _RunArgsParser(argparse.ArgumentParser):
    """``run``'s parser, failing with a ConfigError whose text never carries an argument's value."""

    def __init__(self, source: str) -> None:
        super().__init__(prog="run", add_help=False, exit_on_error=False)
        self.source = source

    def error(self, message: str) -> NoReturn:
        """Name the options, never their values (they may be secrets)."""
        if message.startswith("unrecognized arguments:"):
            names = sorted({a.split("=", 1)[0] for a in message.split(":", 1)[1].split() if a.startswith("-")})
            message = (f"not accepted by run: {', '.join(names) or 'positional arguments'} "
                       "(user arguments go after '--')")
        raise ConfigError(self.source, f"run args: {readable(message)}")


def run_options(args: Sequence[str], source: str) -> argparse.Namespace:
    """Parse the run args (up to their own ``--``) as ``run`` will, to catch mistakes before the job starts."""
    args = list(args)
    ours = args[: args.index("--")] if "--" in args else args
    parser = _RunArgsParser(source)
    add_run_arguments(parser)
    try:
        return parser.parse_args(ours)
    except argparse.ArgumentError as exc:  # exit_on_error=False raises some errors instead of calling error()
        parser.error(str(exc))


def infer_framework(explicit: str | None, image_uri: str, from_args: str | None) -> str | None:
    """--framework, else run's own --framework, else the image's name (``.../pytorch-cpu:tag``)."""
    if explicit and from_args and explicit != from_args:
        raise ConfigError("--framework", f"{explicit} here but the run args say --framework {from_args}")
    if explicit or from_args:
        return explicit or from_args
    found = registry.by_image(image_uri.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0])
    return found.name if found is not None else None


def _is_gpu(pool: PoolSpec | None) -> bool:
    return pool is not None and pool.accelerator is not None and pool.accelerator[0].startswith("NVIDIA")


def _check_reducers(job: JobSpec, source: str, framework: str | None, strategy: str | None) -> list[str]:
    reducers = job.pool(2)
    assert reducers is not None
    chief, workers = job.pool(0), job.pool(1)
    if reducers.accelerator is not None or machines.implied_accelerator(reducers.machine_type):
        raise ConfigError(source, "the Reduction Server pool (workerpool2) must have no accelerators "
                          "(use n1-highcpu-16)")
    if not (_is_gpu(chief) and (workers is None or _is_gpu(workers))):
        raise ConfigError(source, "a Reduction Server needs GPU training pools (it serves NCCL all-reduce); "
                          "add an accelerator or drop the reducers")
    if strategy == "ParameterServerStrategy":
        raise ConfigError(source, "a Reduction Server cannot serve ParameterServerStrategy: workerpool2 is "
                          "either parameter servers or reducers")
    if framework == "tensorflow" and strategy != "MultiWorkerMirroredStrategy":
        raise ConfigError(source, "TensorFlow with a Reduction Server in workerpool2 needs --strategy "
                          "MultiWorkerMirroredStrategy in the args: without it, workerpool2 reads as parameter "
                          "servers at run time")
    training = 1 + (workers.replicas if workers else 0)
    if training < 2:
        raise ConfigError(source, "a Reduction Server needs at least 2 training VMs (chief + workers)")
    assert chief is not None
    warnings = []
    if not network.carries_plugin(chief.image_uri):
        warnings.append(f"{chief.image_uri.rsplit('/', 1)[-1]}: neither its name nor its tag says it carries the "
                        "Reduction Server NCCL plugin (our REDUCTION_SERVER=1 builds are tagged -rs); without it "
                        "the reducers are billed and idle")
    per_vm = network.training_bandwidth(chief.machine_type, chief.accelerator)
    per_reducer = network.reducer_bandwidth(reducers.machine_type)
    if per_vm is None or per_reducer is None:
        return warnings
    needed = network.reducers_needed(training, per_vm, per_reducer)
    if reducers.replicas < needed:
        warnings.append(f"{reducers.replicas} reducers give {reducers.replicas * per_reducer} Gbps, less than the "
                        f"{training} training VMs' {training * per_vm} Gbps of general-purpose network: {needed} "
                        "would match it (--reduction-servers auto)")
    return warnings


def image_cuda(image_uri: str, framework: str | None) -> int | None:
    """The CUDA major version of our GPU image for ``framework`` (None for a CPU variant or another image)."""
    name = image_uri.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
    if name.endswith("-cpu") or framework not in registry.names():
        return None
    return registry.get(framework).cuda_major


def _check_image_gpus(pool: PoolSpec, source: str, framework: str | None) -> list[str]:
    """Refuse GPUs the image's CUDA cannot run; warn about GPUs a CPU image leaves idle."""
    if pool.accelerator is None or not pool.accelerator[0].startswith("NVIDIA"):
        return []
    name = pool.image_uri.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
    if name.endswith("-cpu"):
        return [f"{pool.name}: {name} is a CPU image; the {pool.accelerator[0]} GPUs would sit idle"]
    cuda = image_cuda(pool.image_uri, framework)
    why = machines.cuda_refusal(pool.accelerator[0], cuda) if cuda else None
    if why:
        raise ConfigError(source, f"{pool.name}: our {framework} GPU image is built on CUDA {cuda}; {why}")
    return []


def _check_servers(job: JobSpec, source: str, framework: str | None) -> None:
    why = registry.role_refusal(registry.get(framework), "ps") if framework else None
    if why:
        raise ConfigError(source, f"{why}: workerpool2 of a {framework} job can only be a Reduction Server "
                          "(Google's reductionserver image)")
    if job.pool(1) is None:
        raise ConfigError(source, "ParameterServerStrategy needs at least one worker besides the chief "
                          "(workerpool1)")


def validate(job: JobSpec, source: str, framework: str | None, strategy: str | None = None) -> list[str]:
    """Raise ConfigError for an invalid job; return warnings for a valid but unwise one."""
    chief = job.pool(0)
    if chief is None:
        raise ConfigError(source, "workerpool0 (the chief) is missing: every job has one primary replica")
    if chief.replicas != 1:
        raise ConfigError(source, f"workerpool0 (the chief) must have exactly 1 replica, not {chief.replicas}")
    if len(job.pools) > 4:
        raise ConfigError(source, f"{len(job.pools)} worker pools; Vertex AI has 4 (chief, workers, ps/reducers, "
                          "evaluators)")
    warnings: list[str] = []
    for pool in job.present():
        if pool.replicas < 1:
            raise ConfigError(source, f"{pool.name} has {pool.replicas} replicas; leave an unused pool empty")
        warnings += machines.check_machine_type(f"{source}: {pool.name}", pool.machine_type)
        if not (pool.index == 2 and network.is_reduction_server(pool.image_uri)):
            machines.check_accelerator(f"{source}: {pool.name}", pool.machine_type, pool.accelerator)
        if pool.image_uri == chief.image_uri:
            warnings += _check_image_gpus(pool, source, framework)
    servers = job.pool(2)
    if servers is not None and network.is_reduction_server(servers.image_uri):
        warnings += _check_reducers(job, source, framework, strategy)
    elif servers is not None:
        _check_servers(job, source, framework)
    evaluators = job.pool(3)
    why = registry.role_refusal(registry.get(framework), "evaluator") if framework else None
    if evaluators is not None and why:
        raise ConfigError(source, f"workerpool3: {why}")
    if evaluators is not None and evaluators.replicas > 1:
        warnings.append(f"{evaluators.replicas} evaluators: TensorFlow expects a single evaluator")
    return warnings
