"""The ``run`` command line (README, "Command line"): its parser, and the ``RunOptions`` it produces.

``describe`` and ``doctor`` accept the same options; ``local`` reads each pool's grace period with it and the
job-spec checks (``jobs.args``, ``jobs.tuning``) validate a spec's arguments with it.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from dataclasses import fields
from typing import NoReturn

from entrypoint.cluster.fabric import MODES as FABRIC_MODES
from entrypoint.errors import ConfigError
from entrypoint.options import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_EPOCHS,
    DEFAULT_GRACE_PERIOD,
    DEFAULT_HANG_TIMEOUT,
    DEFAULT_STARTUP_TIMEOUT,
    DEFAULT_TIMEOUT,
    LOG_FORMATS,
    RunOptions,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from entrypoint.planning import registry

UNRECOGNIZED = "unrecognized arguments: "
COMMAND_WORDS = ("run", "describe")  # shown when unexpected (never a secret): local's replica command without '--'
CLOSE = 0.75  # how alike a mistyped option and a real one are for the real one to be suggested (difflib's ratio)


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad option as our one-line configuration error: an unknown option by its name only
    (its value may be a secret), with the closest option it may mean, and where an argument that belongs to
    something else goes (``stray``: run's arguments for the user's code go after ``--``)."""

    stray = "arguments for your code go after '--': python -m entrypoint {command} [options] -- {flag} ..."

    def error(self, message: str) -> NoReturn:
        if message.startswith(UNRECOGNIZED):
            message = self.unrecognized(message.removeprefix(UNRECOGNIZED).split())
        raise ConfigError(self.prog.split()[-1], message)

    def unrecognized(self, extras: list[str]) -> str:
        """What argparse did not recognize, said without values: each unknown option (and the option it is close
        to), and the hint for arguments no option is close to."""
        known = list(self._option_string_actions)
        named, strays, positional, after_flag = [], [], 0, False
        for arg in extras:
            if arg.startswith("-") and len(arg) > 1:
                flag = arg.split("=", 1)[0]
                close = difflib.get_close_matches(flag, known, n=1, cutoff=CLOSE)
                named.append(f"{flag} (did you mean {close[0]}?)" if close else flag)
                strays += [] if close else [flag]
                after_flag = "=" not in arg
            elif after_flag:  # the unknown option's value
                after_flag = False
            else:
                positional += 1
                strays.append(arg if arg in COMMAND_WORDS else "ARG")
        said = [f"unknown option{'s' if len(named) > 1 else ''} {', '.join(named)}"] if named else []
        shown = [arg for arg in strays if arg in COMMAND_WORDS]
        if positional:
            said.append(f"unexpected argument{'s' if positional > 1 else ''} "
                        f"{' '.join(shown) if shown else '(not shown)'}")
        hint = self.stray.format(command=self.prog.split()[-1], flag=strays[0]) if strays and self.stray else ""
        return "; ".join([*said, *([hint] if hint else [])])


def split_user_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split at the first ``--``: our options before it, the rest passed on unchanged."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def parse_options(command: str, argv: Sequence[str]) -> RunOptions:
    """The options of ``run`` / ``describe``, and the user's arguments after ``--``."""
    ours, user_args = split_user_args(argv)
    parser = Parser(prog=f"python -m entrypoint {command}", description="run or describe a training job")
    add_run_arguments(parser)
    return options_from_namespace(parser.parse_args(ours), user_args)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``run`` (``describe`` accepts the same ones to show the plan they give)."""
    code = parser.add_mutually_exclusive_group()
    code.add_argument("--module", help="user module: hooks (build_model, ...) or a script run as python -m")
    code.add_argument("--script", help="a training script file run unchanged")
    parser.add_argument("--framework", choices=registry.names(), help="default: $TRAINER_FRAMEWORK, else the one "
                        "installed")
    parser.add_argument("--strategy", choices=registry.all_strategies(), help="force a distribution strategy")
    parser.add_argument("--job-dir", help="base of all outputs (default ./outputs)")
    parser.add_argument("--model-dir", help="exported model (default $AIP_MODEL_DIR, else <job-dir>/model)")
    parser.add_argument("--checkpoint-dir", help="default $AIP_CHECKPOINT_DIR, else <job-dir>/checkpoints")
    parser.add_argument("--tensorboard-dir", help="default $AIP_TENSORBOARD_LOG_DIR, else <job-dir>/logs")
    parser.add_argument("--nproc-per-node", type=positive_int, help="processes per node (default: GPUs, 1 on CPU)")
    parser.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT,
                        help="seconds to wait for peers at start-up, rendezvous and in collectives (default 300)")
    parser.add_argument("--grace-period", type=positive_float, default=DEFAULT_GRACE_PERIOD,
                        help="seconds a stopping process gets to save before SIGKILL (default 25)")
    parser.add_argument("--hang-timeout", type=non_negative_float, default=DEFAULT_HANG_TIMEOUT,
                        help="fail (retryable) when no training step completes for this long, once the first "
                        "step is over; 0: off (default 1800)")
    parser.add_argument("--startup-timeout", type=non_negative_float, default=DEFAULT_STARTUP_TIMEOUT,
                        help="fail (permanent, exit 124) when the hooks loop's start-up (datasets, model, restore, "
                        "first step) takes longer; 0: off (default 1800)")
    parser.add_argument("--log-format", choices=LOG_FORMATS, help="auto (default, or $TRAINER_LOG_FORMAT): json on "
                        "Kubernetes outside Vertex AI, text elsewhere; json: one Cloud Logging object per line")
    add_fabric_argument(parser)
    loop = parser.add_argument_group("training loop (hooks mode)")
    loop.add_argument("--epochs", type=positive_int, help=f"default: the module's DEFAULTS, else {DEFAULT_EPOCHS}")
    loop.add_argument("--batch-size", type=positive_int,
                      help=f"per-replica batch size (default: the module's DEFAULTS, else {DEFAULT_BATCH_SIZE})")
    loop.add_argument("--log-every", type=positive_int, default=20, help="progress line every N steps")
    loop.add_argument("--checkpoint-every", type=non_negative_int, default=0,
                      help="also checkpoint every N steps (0: only at epoch ends)")
    loop.add_argument("--keep-checkpoints", type=positive_int, default=3, help="committed checkpoints kept")
    loop.add_argument("--checkpoint-mode", choices=("async", "sync"), default="async",
                      help="async: training waits only for a CPU copy of the state (PyTorch/Horovod hooks)")
    loop.add_argument("--resume-from", help="checkpoint to resume from (must exist and load)")
    loop.add_argument("--init-from", help="the model's first weights: a Hugging Face safetensors checkpoint (a "
                      "directory with model.safetensors or its index, or one file; local or gs://), each rank reading "
                      "only its shards; the job's own checkpoints win over it (PyTorch hooks)")
    loop.add_argument("--on-nonfinite", choices=("fail", "skip"), default="fail",
                      help="a NaN/inf training loss: fail (exit 65, nothing exported; default) or skip that step's "
                      "update (PyTorch/Horovod hooks)")
    loop.add_argument("--hypertune-metric", help="evaluation metric reported to Vertex hyperparameter tuning")
    loop.add_argument("--bf16", action="store_true", help="bf16 autocast on GPU")
    loop.add_argument("--clip-grad-norm", type=positive_float)
    loop.add_argument("--seed", type=int, default=42)
    loop.add_argument("--data-workers", type=non_negative_int, help="DataLoader workers (default: 2 on GPU, 0 on CPU)")
    for name in registry.names():  # each framework's own flags, in a group of its own
        flags = registry.get(name).flags
        if flags:
            group = parser.add_argument_group(name)
            for flag in flags:
                if flag.switch:
                    group.add_argument(flag.flag, action="store_true", help=flag.help)
                elif flag.type is not None:
                    group.add_argument(flag.flag, type=flag.type, choices=flag.choices, help=flag.help)
                else:
                    group.add_argument(flag.flag, choices=flag.choices, help=flag.help)


def add_fabric_argument(parser: argparse.ArgumentParser) -> None:
    """``--fabric`` (cluster/fabric.py)."""
    parser.add_argument("--fabric", choices=FABRIC_MODES, help="auto (default, or $TRAINER_FABRIC): find this "
                        "node's GPU fabric (gIB, TCPXO, TCPX) and pass its host profile's variables on; off: leave "
                        "the environment as it is; gib|tcpxo|tcpx: that fabric must be there (docs/fabric.md)")


def options_from_namespace(ns: argparse.Namespace, user_args: list[str]) -> RunOptions:
    """Build RunOptions from a parsed namespace."""
    names = {f.name for f in fields(RunOptions)} - {"user_args", "framework_options"}
    values = {name: getattr(ns, name) for name in names if hasattr(ns, name)}
    own = [flag.name for name in registry.names() for flag in registry.get(name).flags]
    given = tuple((name, getattr(ns, name)) for name in own if getattr(ns, name, None) not in (None, False))
    return RunOptions(**values, framework_options=given, user_args=tuple(user_args))
