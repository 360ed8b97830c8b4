"""``python -m entrypoint job vertex|kubeflow [options] -- RUN ARGS``: print the job for an image.

The job goes to stdout; notes (how ``--reduction-servers auto`` sized the reducers) and warnings go
to stderr, so ``job vertex ... > spec.json`` keeps the file clean.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from entrypoint import registry
from entrypoint.errors import ConfigError, ExitCode
from entrypoint.jobs import formats, machines, yamltext
from entrypoint.jobs.kubeflow import KINDS, KubeflowRequest, build_manifest
from entrypoint.jobs.vertex import DEFAULT_MACHINE, DEFAULT_REGION, VertexRequest, build, split_run_args

USAGE = "python -m entrypoint job {vertex,kubeflow} --image URI [options] -- RUN ARGS"


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one ConfigError line naming options, never their values."""

    def error(self, message: str) -> NoReturn:
        """Unknown options by name only (their values may be secrets)."""
        if message.startswith("unrecognized arguments:"):
            names = sorted({a.split("=", 1)[0] for a in message.split(":", 1)[1].split() if a.startswith("-")})
            message = f"unknown options: {', '.join(names) or 'positional arguments'} (run args go after '--')"
        raise ConfigError(self.prog, message)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image", required=True, help="the trainer image URI (ours, or one built on it)")
    parser.add_argument("--framework", choices=registry.names(),
                        help="default: run's --framework, else the image's name")
    parser.add_argument("--workers", type=int, default=1, help="training replicas, as local --workers: "
                        "1 chief + N-1 workers")
    parser.add_argument("--ps", type=int, default=0, help="parameter servers (TensorFlow)")
    parser.add_argument("--evaluators", type=int, default=0, help="evaluators (TensorFlow)")


def _vertex_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser("vertex", help="a Vertex AI CustomJob", description="a Vertex AI CustomJob for an image")
    _common(p)
    p.add_argument("--machine-type", default=DEFAULT_MACHINE, help=f"every pool of ours (default {DEFAULT_MACHINE})")
    p.add_argument("--accelerator", metavar="TYPE:COUNT", help="e.g. NVIDIA_TESLA_T4:1 (implied by A2/A3/G2 types)")
    p.add_argument("--ps-machine-type", help="parameter servers' machine type (default: --machine-type)")
    p.add_argument("--reduction-servers", metavar="N|auto", help="a Reduction Server pool (GPU jobs using NCCL); "
                   "auto: sized so the reducers' bandwidth matches the training VMs'")
    p.add_argument("--reduction-server-machine-type", default=machines.DEFAULT_REDUCER_MACHINE,
                   help=f"default {machines.DEFAULT_REDUCER_MACHINE} (32 Gbps)")
    p.add_argument("--display-name", help="default: the image's name")
    p.add_argument("--base-output-dir", metavar="gs://...", help="Vertex sets AIP_MODEL_DIR etc. under it "
                   "(per trial in a tuning job)")
    p.add_argument("--region", default=DEFAULT_REGION, help="for the gcloud/python formats and the reducer image")
    p.add_argument("--project", help="for the gcloud-command and python formats (default: gcloud's)")
    p.add_argument("--format", choices=formats.FORMATS, default="json")


def _kubeflow_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser("kubeflow", help="a Kubeflow PyTorchJob or TFJob",
                       description="a Kubeflow Training Operator manifest for an image")
    p.add_argument("--kind", choices=tuple(KINDS), required=True)
    _common(p)
    p.add_argument("--gpus", type=int, default=0, help="nvidia.com/gpu per pod (PyTorchJob: also nprocPerNode)")
    p.add_argument("--name", help="metadata.name (default: <image name>-job)")
    p.add_argument("--namespace")
    p.add_argument("--backoff-limit", type=int, default=3, help="runPolicy.backoffLimit: restarts before failing")


def parser() -> _Parser:
    """``job``'s command line."""
    top = _Parser(prog="python -m entrypoint job", description=f"print the job for an image: {USAGE}")
    sub = top.add_subparsers(dest="target", required=True, parser_class=_Parser)
    _vertex_parser(sub)
    _kubeflow_parser(sub)
    return top


def _vertex(ns: argparse.Namespace, run_args: tuple[str, ...]) -> str:
    req = VertexRequest(
        image=ns.image, run_args=run_args, framework=ns.framework, workers=ns.workers,
        machine_type=ns.machine_type, accelerator=ns.accelerator, ps=ns.ps, ps_machine_type=ns.ps_machine_type,
        evaluators=ns.evaluators, reduction_servers=ns.reduction_servers,
        reduction_server_machine_type=ns.reduction_server_machine_type, display_name=ns.display_name,
        base_output_dir=ns.base_output_dir, region=ns.region,
    )
    job, notes, warnings = build(req)
    if ns.format == "json":
        text = formats.render_json(job)
    elif ns.format == "gcloud-config":
        text = formats.render_gcloud_config(job, ns.region)
    elif ns.format == "gcloud-command":
        text, more = formats.render_gcloud_command(job, ns.region, ns.project)
        warnings += more
    else:
        text = formats.render_python(job, ns.region, ns.project)
    for note in notes:
        print(f"entrypoint: note: {note}", file=sys.stderr)
    for warning in warnings:
        print(f"entrypoint: warning: {warning}", file=sys.stderr)
    return text


def _kubeflow(ns: argparse.Namespace, run_args: tuple[str, ...]) -> str:
    req = KubeflowRequest(
        kind=ns.kind, image=ns.image, run_args=run_args, framework=ns.framework, workers=ns.workers,
        gpus=ns.gpus, ps=ns.ps, evaluators=ns.evaluators, name=ns.name, namespace=ns.namespace,
        backoff_limit=ns.backoff_limit,
    )
    return yamltext.dump(build_manifest(req))


def main(argv: Sequence[str]) -> int:
    """Print the job; ConfigError (exit 2) for an invalid combination."""
    ours, run_args = split_run_args(argv)
    if not ours or ours[0] in ("-h", "--help"):
        parser().print_help()
        return ExitCode.OK if ours else ExitCode.CONFIG
    ns = parser().parse_args(ours)
    text = _vertex(ns, run_args) if ns.target == "vertex" else _kubeflow(ns, run_args)
    sys.stdout.write(text)
    return ExitCode.OK
