"""``python -m entrypoint job vertex|vertex-tuning|kubeflow [options] -- RUN ARGS``: print the job for an image.

The job goes to stdout; notes (how ``--reduction-servers auto`` sized the reducers) and warnings go
to stderr, so ``job vertex ... > spec.json`` keeps the file clean.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import NoReturn

from entrypoint.cluster import envvars as ev
from entrypoint.errors import ConfigError, ExitCode
from entrypoint.jobs import network, pinning, yamltext
from entrypoint.jobs.args import framework_args, readable, run_options, with_run_option
from entrypoint.jobs.images import parse_image
from entrypoint.jobs.kubeflow import fabricpods, placement, pods, roles
from entrypoint.jobs.kubeflow import job as kubeflow
from entrypoint.jobs.kubeflow.job import KINDS, KubeflowRequest
from entrypoint.jobs.kubeflow.trainjob import build_trainjob
from entrypoint.jobs.vertex import formats, pyformat, tuning
from entrypoint.jobs.vertex import options as vertexopts
from entrypoint.jobs.vertex import pools as vertexpools
from entrypoint.jobs.vertex.job import DEFAULT_MACHINE, DEFAULT_REGION, VertexRequest, build
from entrypoint.planning import registry
from entrypoint.planning.runargs import split_user_args

USAGE = "python -m entrypoint job {vertex,vertex-tuning,kubeflow} --image URI [options] -- RUN ARGS"
TUNING_FORMATS = ("json", "gcloud-config", "python")


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one ConfigError line naming options, never their values."""

    def error(self, message: str) -> NoReturn:
        """Unknown options by name only (their values may be secrets); a missing choice lists the choices."""
        if message.startswith("unrecognized arguments:"):
            names = sorted({a.split("=", 1)[0] for a in message.split(":", 1)[1].split() if a.startswith("-")})
            message = f"unknown options: {', '.join(names) or 'positional arguments'} (run args go after '--')"
        named = {word.strip(":,") for word in message.split()}
        choices = [f"{a.option_strings[-1]} {'|'.join(map(str, a.choices))}" for a in self._actions
                   if a.choices and a.option_strings and a.option_strings[-1] in named
                   and ("required" in message or "expected one argument" in message)]
        raise ConfigError(self.prog, readable(message) + (f" (choose {'; '.join(choices)})" if choices else ""))


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image", required=True, help="the trainer image URI (ours, or one built on it); "
                        "NAME@sha256:... pins it (never name:tag@sha256:...)")
    parser.add_argument("--pin", action="store_true", help="write the image by the digest its tag names now (asks "
                        "the registry; a local build's record for localhost/...)")
    parser.add_argument("--framework", choices=registry.names(),
                        help="default: run's --framework, else the image's name")
    parser.add_argument("--workers", type=int, default=1, help="training replicas, as local --workers: "
                        "1 chief + N-1 workers")
    parser.add_argument("--ps", type=int, default=0, help=f"parameter servers ({_serving('ps')})")
    parser.add_argument("--evaluators", type=int, default=0, help=f"evaluators ({_serving('evaluator')})")


def _vertex_options(p: argparse.ArgumentParser, formats_: tuple[str, ...]) -> None:
    _common(p)
    p.add_argument("--machine-type", default=DEFAULT_MACHINE, help=f"every pool of ours (default {DEFAULT_MACHINE})")
    p.add_argument("--accelerator", metavar="TYPE:COUNT", help="e.g. NVIDIA_TESLA_T4:1 (implied by A2/A3/A4/G2 types)")
    p.add_argument("--ps-machine-type", help="parameter servers' machine type (default: --machine-type)")
    p.add_argument("--reduction-servers", metavar="N|auto", help="a Reduction Server pool (GPU jobs using NCCL); "
                   "auto: sized so the reducers' bandwidth matches the training VMs' general-purpose network")
    p.add_argument("--reduction-server-machine-type", default=network.DEFAULT_REDUCER_MACHINE,
                   help=f"default {network.DEFAULT_REDUCER_MACHINE} (32 Gbps)")
    p.add_argument("--display-name", help="default: the image's name")
    p.add_argument("--base-output-dir", metavar="gs://...", help="Vertex sets AIP_MODEL_DIR etc. under it "
                   "(per trial in a tuning job)")
    p.add_argument("--region", default=DEFAULT_REGION, help="for the gcloud/python formats and the reducer image")
    p.add_argument("--project", help="for the gcloud-command and python formats (default: gcloud's)")
    p.add_argument("--format", choices=formats_, default="json")
    vertexopts.add_arguments(p)
    vertexpools.add_arguments(p)


def parser() -> _Parser:
    """``job``'s command line."""
    top = _Parser(prog="python -m entrypoint job", description=f"print the job for an image: {USAGE}")
    sub = top.add_subparsers(dest="target", required=True, parser_class=_Parser)
    _vertex_options(sub.add_parser("vertex", help="a Vertex AI CustomJob",
                                   description="a Vertex AI CustomJob for an image"), formats.FORMATS)
    tune = sub.add_parser("vertex-tuning", help="a Vertex AI HyperparameterTuningJob",
                          description="a Vertex AI HyperparameterTuningJob whose trials are job vertex's CustomJob")
    _vertex_options(tune, TUNING_FORMATS)
    tuning.add_arguments(tune)
    kf = sub.add_parser("kubeflow", help="a Kubeflow PyTorchJob, TFJob or Trainer v2 TrainJob",
                        description="a Kubeflow Training Operator or Trainer v2 manifest for an image")
    kf.add_argument("--kind", choices=tuple(KINDS), required=True)
    _common(kf)
    kubeflow.add_arguments(kf)
    pods.add_arguments(kf)
    placement.add_arguments(kf)
    roles.add_arguments(kf)
    return top


Env = tuple[tuple[str, str], ...]


def image_option(ns: argparse.Namespace, env: Env, flag: str) -> tuple[str, list[str], Env]:
    """--image checked (a digest without a tag) or pinned (--pin); a pinned image's reference in the env of our
    containers as TRAINER_IMAGE, which doctor and the training summary report (a container cannot learn it)."""
    pinning.check_reference(ns.image)
    image, notes = ns.image, []
    if ns.pin:
        image, line = pinning.pin(ns.image)
        notes.append(line)
    if not parse_image(image).digest:
        return image, notes, env
    if any(name == ev.TRAINER_IMAGE for name, _ in env):
        raise ConfigError(flag, f"{ev.TRAINER_IMAGE} is written by the job from its pinned --image; do not set it")
    return image, notes, (*env, (ev.TRAINER_IMAGE, image))


def _request(ns: argparse.Namespace, run_args: tuple[str, ...]) -> tuple[VertexRequest, list[str], list[str]]:
    """The request, warnings, and notes (how --pin found the digest)."""
    extras, warnings = vertexpools.pool_extras(ns, ns.region)
    image, notes, env = image_option(ns, extras.env, "--env")
    extras = replace(extras, env=env)
    vertexpools.check_env(list(env), "--env")
    settings = vertexopts.settings(ns, ns.region)
    warnings += vertexpools.cross_check(settings, extras)
    req = VertexRequest(
        image=image, run_args=run_args, framework=ns.framework, workers=ns.workers,
        machine_type=ns.machine_type, accelerator=ns.accelerator, ps=ns.ps, ps_machine_type=ns.ps_machine_type,
        ps_disk=(ns.ps_boot_disk_type, ns.ps_boot_disk_size),
        evaluators=ns.evaluators, reduction_servers=ns.reduction_servers,
        reduction_server_machine_type=ns.reduction_server_machine_type, display_name=ns.display_name,
        base_output_dir=ns.base_output_dir, region=ns.region, settings=settings, extras=extras,
        evaluator=vertexpools.evaluator_machines(ns),
    )
    return req, warnings, notes


def _vertex(ns: argparse.Namespace, run_args: tuple[str, ...]) -> tuple[str, list[str], list[str]]:
    req, warnings, pinned = _request(ns, run_args)
    job, notes, more = build(req)
    warnings += more
    notes = [*pinned, *notes]
    if ns.format == "json":
        text = formats.render_json(job.rest_custom_job())
    elif ns.format == "gcloud-config":
        text = formats.render_gcloud_config(job, ns.region)
    elif ns.format == "gcloud-command":
        text, more = formats.render_gcloud_command(job, ns.region, ns.project)
        warnings += more
    else:
        text = pyformat.render_python(job, ns.region, ns.project)
    return text, notes, warnings


def tuning_run_args(run_args: tuple[str, ...], metric: str) -> tuple[tuple[str, ...], list[str]]:
    """The trials' args: run's --hypertune-metric the study's, and a '--' for the values Vertex appends."""
    notes = []
    ours, _ = split_user_args(run_args)
    given = [ours[i + 1] for i, a in enumerate(ours[:-1]) if a == "--hypertune-metric"]
    given += [a.split("=", 1)[1] for a in ours if a.startswith("--hypertune-metric=")]
    if given and given[-1] != metric:
        raise ConfigError("--hypertune-metric", "differs from the run args' --hypertune-metric: the study would "
                          "wait for a metric the trials never report")
    if not given:
        run_args = with_run_option(run_args, "--hypertune-metric", metric)
        notes.append(f"the args report the study's metric: --hypertune-metric {metric} added")
    if "--" not in run_args:
        run_args = (*run_args, "--")
        notes.append("the args end with '--': Vertex AI appends each trial's --PARAMETER=VALUE after them, "
                     "where your code reads its arguments")
    return run_args, notes


def _vertex_tuning(ns: argparse.Namespace, run_args: tuple[str, ...]) -> tuple[str, list[str], list[str]]:
    study, warnings = tuning.study(ns)
    run_args, notes = tuning_run_args(run_args, study.metric)
    req, more, pinned = _request(ns, run_args)
    job, more_notes, checks = build(req)
    warnings += more + checks
    more_notes = [*pinned, *more_notes]
    resource = {"displayName": job.display_name, **study.rest_fields(), "trialJobSpec": job.rest_job_spec(),
                **job.settings.rest_resource_fields()}
    if ns.format == "json":
        text = formats.render_json(resource)
    elif ns.format == "gcloud-config":
        document = {k: v for k, v in resource.items() if k not in ("displayName", "labels", "encryptionSpec")}
        text = formats.render_gcloud_config(job, ns.region, "hp-tuning-jobs", document)
    else:
        text = pyformat.render_python_tuning(job, study, ns.region, ns.project)
    return text, notes + more_notes, warnings


def _kubeflow(ns: argparse.Namespace, run_args: tuple[str, ...]) -> tuple[str, list[str], list[str]]:
    base = pods.from_namespace(ns)
    image, notes, env = image_option(ns, base.env, "--env")
    base = replace(base, env=env)
    run_args, more = framework_args(run_args, image, ns.framework, run_options(run_args, "job kubeflow").framework)
    notes += more
    labels, annotations, gang, warnings = kubeflow.metadata_options(ns)
    if any(v.kind == "gcs" for v in base.volumes) and base.service_account is None:
        warnings.append("--volume gcs: the pods read the bucket as their Kubernetes service account (Workload "
                        "Identity): give --service-account")
    req = KubeflowRequest(
        kind=ns.kind, image=image, run_args=run_args, framework=ns.framework, workers=ns.workers,
        ps=ns.ps, evaluators=ns.evaluators, name=ns.name, namespace=ns.namespace,
        backoff_limit=ns.backoff_limit, clean_pod_policy=ns.clean_pod_policy,
        ttl_seconds_after_finished=ns.ttl_seconds_after_finished,
        active_deadline_seconds=ns.active_deadline_seconds, runtime=ns.runtime, pods=base,
        role_pods=roles.role_options(ns, ns.kind, base), labels=labels, annotations=annotations, gang=gang,
    )
    manifest = build_trainjob(req) if ns.kind == "trainjob" else kubeflow.build_v1(req)
    if ns.kind != "trainjob":
        warnings += kubeflow.gang_layout(req)[1]
    warnings += _fabric_warnings(req)
    return kubeflow.header(req) + yamltext.dump(manifest), notes, warnings


def _fabric_warnings(req: KubeflowRequest) -> list[str]:
    """GPU pods selecting A3 High/Mega/Ultra or A4 nodes (--node-selector, or a required --node-affinity In those
    labels) without the fabric's pieces: NCCL would take the general NIC. A TrainJob cannot take --node-fabric
    (trainjob.py refuses it): its runtime must carry them, and the warning names what."""
    out = []
    for opts in dict.fromkeys([req.pods, *req.role_pods.values()]):
        fabric = fabricpods.fabric_for(opts.node_selector, opts.placement.node_affinity)
        if not opts.gpus or opts.fabric is not None or fabric is None:
            continue
        chosen = "--node-selector" if fabricpods.fabric_for(opts.node_selector) else "--node-affinity"
        if req.kind == "trainjob":
            line = (f"{chosen} selects nodes with GPUDirect ({fabric}); a TrainJob cannot take --node-fabric, so "
                    f"its runtime ({req.runtime}) must carry {fabricpods.runtime_pieces(fabric)}, or NCCL runs over "
                    "the general-purpose NIC (docs/fabric.md)")
        else:
            line = (f"{chosen} selects nodes with GPUDirect ({fabric}) but the pods get none of its pieces: "
                    f"without --node-fabric {fabric} NCCL runs over the general-purpose NIC (docs/fabric.md)")
        out += [line] if line not in out else []
    return out


def main(argv: Sequence[str]) -> int:
    """Print the job; ConfigError (exit 2) for an invalid combination."""
    ours, after = split_user_args(argv)  # everything after the first '--' (its own '--' too) is the run args
    run_args = tuple(after)
    if not ours or ours[0] in ("-h", "--help"):
        parser().print_help()
        return ExitCode.OK if ours else ExitCode.CONFIG
    ns = parser().parse_args(ours)
    notes: list[str] = []
    warnings: list[str] = []
    if ns.target == "vertex":
        text, notes, warnings = _vertex(ns, run_args)
    elif ns.target == "vertex-tuning":
        text, notes, warnings = _vertex_tuning(ns, run_args)
    else:
        text, notes, warnings = _kubeflow(ns, run_args)
    for note in notes:
        print(f"entrypoint: note: {note}", file=sys.stderr)
    for warning in warnings:
        print(f"entrypoint: warning: {warning}", file=sys.stderr)
    sys.stdout.write(text)
    return ExitCode.OK


def _serving(role: str) -> str:
    """The frameworks whose replicas include ``role``, as people write them (``TensorFlow``)."""
    return " / ".join(f.label for f in registry.serving(role)) or "no framework"
