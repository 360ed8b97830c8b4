"""The command line: ``run``, ``describe``, ``doctor``, ``local``, ``job``, ``goodput`` and ``sbom``; failures become
exit codes once."""

from __future__ import annotations

import difflib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from entrypoint import failures
from entrypoint.cluster import envvars as ev
from entrypoint.cluster import fabric
from entrypoint.cluster.environments import read_settings, resolve, secret_like_names
from entrypoint.cluster.environments.settings import is_secret_name, secret_values
from entrypoint.cluster.gpus import detect_gpu_count
from entrypoint.errors import ConfigError, ExitCode, TrainerError
from entrypoint.options import RunOptions
from entrypoint.outputs.locations import resolve_outputs
from entrypoint.outputs.logs import resolve_format, to_stderr
from entrypoint.outputs.progress import setup_logging
from entrypoint.outputs.redaction import MASK, hide
from entrypoint.planning import registry
from entrypoint.planning.plan import Plan, make_plan
from entrypoint.planning.runargs import (
    Parser,
    add_run_arguments,
    options_from_namespace,
    parse_options,
    split_user_args,
)

# Each command and what it does (``python -m entrypoint --help``).
COMMAND_HELP = {
    "run": "train: run your code on this node as the cluster's variables say (the images' ENTRYPOINT)",
    "describe": "what run would do here, as JSON: topology, strategy, processes, outputs (imports no ML framework)",
    "doctor": "check this node for the job before it runs, one line a check (--json for machines)",
    "local": "emulate a Vertex AI cluster on this machine: real replicas, -- run ... (or --spec FILE)",
    "job": "write a Vertex AI CustomJob or tuning job, or a Kubeflow manifest, for an image (job vertex ...)",
    "goodput": "where a job's hours went, from its job dir's ledger (goodput JOB_DIR)",
    "sbom": "the image's bill of materials: write it at build, or show it (sbom --help)",
}
COMMANDS = tuple(COMMAND_HELP)
USAGE = f"usage: python -m entrypoint {{{','.join(COMMANDS)}}} ...  (python -m entrypoint COMMAND --help)"


def build_plan(options: RunOptions) -> Plan:
    """Resolve the environment and make the plan (the only place both meet)."""
    settings = read_settings()
    return make_plan(resolve(), options, settings, detect_gpu_count(settings.cuda_visible_devices))


def describe(plan: Plan) -> dict[str, Any]:
    """The JSON ``describe`` prints: topology, plan, emitted variables, and secret-looking names only."""
    return {"topology": plan.topology.describe(), "plan": plan.describe(), "env": plan.emitted_env(),
            "secret_like_variables": secret_like_names(), "fabric": describe_fabric(plan)}


def describe_fabric(plan: Plan) -> dict[str, Any]:
    """The fabric step ``run`` would take here: found, profile, every variable set (secret values hidden) and
    removed (docs/fabric.md)."""
    settings = read_settings()
    step = fabric.prepare(fabric.mode_of(plan.options.fabric, settings.fabric), os.environ, settings.fabric_root)
    view = step.describe()
    secrets = secret_values() | {value for name, value in step.set.items() if is_secret_name(name)}
    view["set"] = {name: MASK if is_secret_name(name) else hide(value, secrets) for name, value in step.set.items()}
    return view


def _describe(argv: Sequence[str]) -> int:
    print(json.dumps(describe(build_plan(parse_options("describe", argv))), indent=2, sort_keys=True))
    return ExitCode.OK


def _doctor(argv: Sequence[str]) -> int:
    """``doctor [run options] [--json]``: this node's checks against the plan those options give."""
    from entrypoint.doctor import report

    ours, user_args = split_user_args(argv)
    parser = Parser(prog="python -m entrypoint doctor", description="check this node for the job, one line a check")
    add_run_arguments(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    namespace = parser.parse_args(ours)
    return report(build_plan(options_from_namespace(namespace, user_args)), read_settings(), namespace.json)


def _goodput(argv: Sequence[str]) -> int:
    """``goodput JOB_DIR [--json] [--plot FILE]``: where the job's hours went, from its ledger (docs/goodput.md)."""
    import argparse

    from entrypoint.lifecycle.recorder import report_for

    parser = argparse.ArgumentParser(prog="python -m entrypoint goodput",
                                     description="where a job's hours went: goodput and badput from its ledger")
    parser.add_argument("job_dir", help="the job dir (a local path or gs://...)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the report")
    parser.add_argument("--plot", metavar="FILE", help="draw the job as a timeline into FILE (.svg or .png)")
    args = parser.parse_args(argv)
    report = report_for(args.job_dir)
    if isinstance(report, str):  # no ledger: what its summary and checkpoints say
        print(report)
        return ExitCode.OK
    if args.plot:
        from entrypoint.outputs.goodput.plot import write_plot

        write_plot(args.plot, report.timeline())
    print(json.dumps(report.to_dict(), indent=2, sort_keys=True) if args.json else report.text())
    return ExitCode.OK


def _sbom(argv: Sequence[str]) -> int:
    """``sbom [show [FILE]]`` / ``sbom write OUT``: the image's bill of materials (outputs/sbom.py)."""
    import argparse
    from pathlib import Path

    from entrypoint.errors import ConfigError
    from entrypoint.outputs import sbom

    parser = argparse.ArgumentParser(prog="python -m entrypoint sbom", description="the image's bill of materials "
                                     "(CycloneDX): its hash and counts, or (in an image build) write it")
    sub = parser.add_subparsers(dest="action")
    make = sub.add_parser("write", help="inventory the OS packages and this interpreter's Python packages into OUT")
    make.add_argument("out", help=f"where to write it (the images: {sbom.SBOM_PATH})")
    make.add_argument("--variant", default="", help="the image's variant (cpu, gpu), recorded in the document")
    show = sub.add_parser("show", help="one line: the document's sha256 and what it lists (the default)")
    show.add_argument("path", nargs="?", help=f"default: ${ev.TRAINER_SBOM}, else {sbom.SBOM_PATH}")
    args = parser.parse_args(argv)
    settings = read_settings()
    try:
        if args.action == "write":
            sbom.write(Path(args.out), {"framework": settings.framework or "", "variant": args.variant})
        print(sbom.summary(Path(args.out if args.action == "write" else getattr(args, "path", None) or settings.sbom)))
    except ValueError as exc:
        raise ConfigError("sbom", str(exc)) from None
    return ExitCode.OK


def _one_line_errors(command: Callable[[Sequence[str]], int], argv: Sequence[str]) -> int:
    """Commands that train nothing themselves (describe, doctor, local, job): a failure is classified like any
    other (``failures.classify``) and ends as one line on stderr and its exit code, without a record."""
    try:
        return command(argv)
    except SystemExit:
        raise  # --help, or a status the command chose itself
    except BaseException as exc:
        failure, secrets = failures.classify(exc), secret_values()
        if failure.traceback and not isinstance(exc, TrainerError):  # not one of ours: where it came from helps
            print(failures.redact(failure.traceback, secrets), file=sys.stderr, end="")
        to_stderr(failures.error_line(failures.redact(failure.message, secrets)))
        return failure.exit_code


def _run(options: RunOptions, ctx: failures.FailureContext) -> int:
    from entrypoint.lifecycle.jobdir import jobrecord
    from entrypoint.lifecycle.runner import describe_failures, refuse_if_in_use, refused_records, run_node

    settings = read_settings()
    ctx.job_dir = resolve_outputs(job_dir=options.job_dir or settings.job_dir,
                                  model_dir=options.model_dir or settings.model_dir, checkpoint_dir=None,
                                  tensorboard_dir=None, trial=None).job_dir
    ctx.run_started = settings.run_started  # `local`'s run: records from before it are an earlier run's
    ctx.replica = "this node"  # until the cluster's variables name it (they may be what is wrong)
    topology = resolve()
    ctx.replica = topology.replica_name
    plan = make_plan(topology, options, settings, detect_gpu_count(settings.cuda_visible_devices))
    describe_failures(ctx, plan)
    script = plan.code is not None and plan.code.kind == "script"
    missing = registry.require_installed(registry.get(plan.framework),
                                         "--framework" if options.framework else ev.TRAINER_FRAMEWORK, script=script)
    refused = jobrecord.refusal(plan.outputs.job_dir, plan.framework, plan.code)  # another job's dir
    if refused is not None:
        ctx.job_dir = refused_records()  # that job's failures/ are its own
        raise refused
    log_format = resolve_format(options.log_format, settings, plan.topology.source,
                                registry.get(plan.framework).prefixed_output)
    os.environ[ev.TRAINER_LOG_FORMAT] = log_format  # every process of the run writes the same format
    setup_logging(fmt=log_format, trial=plan.topology.trial)
    if missing:
        logging.getLogger("entrypoint").warning("%s", missing)
    from entrypoint.doctor import preflight

    refuse_if_in_use(plan, ctx)  # "in use by another live job" says more than what that job did to the dir
    return run_node(preflight(plan, settings), ctx)


def usage() -> str:
    """The usage line and what each command does (``python -m entrypoint --help``)."""
    width = max(map(len, COMMANDS))
    return "\n".join([USAGE, "", "commands:", *(f"  {name:<{width}}  {what}" for name, what in COMMAND_HELP.items()),
                      "", "Each runs in the Python of a trainer image or of a framework's environment (README, "
                      "\"Which Python\")."])


def unknown_command(word: str) -> str:
    """The one line a command that is not one gets: the closest command, or where the command goes."""
    if word.startswith("-"):
        hint = f"the command comes first: python -m entrypoint run {word} ..."
    else:
        close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else f"expected one of {', '.join(COMMANDS)}"
    return failures.error_line(f"unknown command {word!r}: {hint} (python -m entrypoint --help says what each does)")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: returns the process exit code (see docs/EXIT_CODES.md)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        asked = bool(args) and args[0] in ("-h", "--help")
        print(usage() if asked or not args else unknown_command(args[0]), file=sys.stdout if asked else sys.stderr)
        return ExitCode.OK if asked else ExitCode.CONFIG
    command, rest = args[0], args[1:]
    if command == "describe":
        return _one_line_errors(_describe, rest)
    if command == "doctor":
        return _one_line_errors(_doctor, rest)
    if command == "local":
        from entrypoint.local.emulator import main as local_main

        return _one_line_errors(local_main, rest)
    if command == "goodput":
        return _one_line_errors(_goodput, rest)
    if command == "sbom":
        return _one_line_errors(_sbom, rest)
    if command == "job":
        from entrypoint.jobs.cli import main as job_main

        return _one_line_errors(job_main, rest)
    try:  # a mistyped command line is one line (flags named, never values), before anything else happens
        options = parse_options("run", rest)
    except ConfigError as exc:
        to_stderr(failures.error_line(str(exc)))
        return failures.classify(exc).exit_code
    ctx = failures.FailureContext()
    return failures.guarded(lambda: _run(options, ctx), ctx)
