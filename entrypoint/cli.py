"""Run or describe a training job: the command line, and failures turned into exit codes (once, here)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from entrypoint.environments import read_settings, resolve, secret_like_names
from entrypoint.errors import ExitCode, TrainerError
from entrypoint.gpus import detect_gpu_count
from entrypoint.options import RunOptions, add_run_arguments, options_from_namespace
from entrypoint.plan import Plan, make_plan

# Launchers load lazily: the PyTorch path never imports TensorFlow and ``describe`` imports neither.
LAUNCHERS = {
    "pytorch": "entrypoint.pytorch.launch:launch",
    "tensorflow": "entrypoint.tensorflow.launch:launch",
    "horovod": "entrypoint.horovod.launch:launch",
}
COMMANDS = ("run", "describe", "local", "job")


def _split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split at the first ``--``: our options before it, the rest passed on unchanged."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def _run_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="run or describe a training job")
    add_run_arguments(parser)
    return parser


def build_plan(options: RunOptions) -> Plan:
    """Resolve the environment and make the plan (the only place both meet)."""
    topology = resolve()
    settings = read_settings()
    return make_plan(topology, options, settings, detect_gpu_count(settings.cuda_visible_devices))


def describe(plan: Plan) -> dict[str, Any]:
    """The JSON ``describe`` prints: topology, plan, emitted variables, and secret-looking names only."""
    return {
        "topology": plan.topology.describe(),
        "plan": plan.describe(),
        "env": plan.emitted_env(),
        "secret_like_variables": secret_like_names(),
    }


def _load_launcher(framework: str) -> Callable[[Plan, RunOptions], int]:
    module_name, _, attr = LAUNCHERS[framework].partition(":")
    launcher: Callable[[Plan, RunOptions], int] = getattr(importlib.import_module(module_name), attr)
    return launcher


def _main(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        asked = bool(argv) and argv[0] in ("-h", "--help")
        print("usage: python -m entrypoint {run,describe,local,job} ...  (python -m entrypoint COMMAND --help)",
              file=sys.stdout if asked else sys.stderr)
        return ExitCode.OK if asked else ExitCode.CONFIG
    command, rest = argv[0], argv[1:]
    if command == "local":
        from entrypoint.emulator import main as local_main

        return local_main(rest)
    if command == "job":
        from entrypoint.jobs.cli import main as job_main

        return job_main(rest)
    ours, user_args = _split(rest)
    ns = _run_parser(f"python -m entrypoint {command}").parse_args(ours)
    options = options_from_namespace(ns, user_args)
    plan = build_plan(options)
    if command == "describe":
        print(json.dumps(describe(plan), indent=2, sort_keys=True))
        return ExitCode.OK
    return _load_launcher(plan.framework)(plan, options)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: returns the process exit code (see docs/EXIT_CODES.md)."""
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except TrainerError as exc:
        print(f"entrypoint: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("entrypoint: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
