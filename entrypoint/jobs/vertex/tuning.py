"""``job vertex-tuning``: a HyperparameterTuningJob whose trials are the CustomJob ``job vertex`` would write.

Vertex AI runs each trial as that CustomJob with the trial's values added to the container args as
``--<parameterId>`` arguments (https://cloud.google.com/vertex-ai/docs/training/using-hyperparameter-tuning),
after the run args: so the run args must end with their own ``--`` section, where the user's code reads
them. The study (https://cloud.google.com/vertex-ai/docs/reference/rest/v1/StudySpec): metrics whose ids
"must not contain whitespaces and must be unique", parameters (``jobs.params``), the algorithm, which
measurement of a trial counts (unspecified is "treated as LAST_MEASUREMENT"; the SDK's default is "best", so
every format says it), and an automated early-stopping rule (decay curve, median or convex).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.jobs.vertex.params import Parameter, nest, parse_parameter
from entrypoint.planning.runargs import add_run_arguments

GOALS = ("MAXIMIZE", "MINIMIZE")
ALGORITHMS = {"bayesian": "ALGORITHM_UNSPECIFIED", "grid": "GRID_SEARCH", "random": "RANDOM_SEARCH"}
MEASUREMENTS = {"last": "LAST_MEASUREMENT", "best": "BEST_MEASUREMENT"}
STOPPING = {"decay-curve": "decayCurveStoppingSpec", "median": "medianAutomatedStoppingSpec",
            "convex": "convexAutomatedStoppingSpec"}
# --early-stopping convex:KEY=VALUE,... -> ConvexAutomatedStoppingSpec's fields (int64 as proto JSON strings).
_CONVEX = {"max-steps": "maxStepCount", "min-steps": "minStepCount", "min-measurements": "minMeasurementCount",
           "learning-rate-parameter": "learningRateParameterName"}
_WHITESPACE = re.compile(r"\s")


@dataclass(frozen=True)
class Study:
    """The study and trial counts of a tuning job."""

    metrics: tuple[tuple[str, str], ...]  # (metricId, goal); the first is the one run reports
    parameters: tuple[Parameter, ...]
    algorithm: str
    max_trials: int
    parallel_trials: int
    max_failed_trials: int
    measurement: str = "LAST_MEASUREMENT"
    stopping: tuple[str, dict[str, Any]] | None = None  # (StudySpec field, its spec)

    @property
    def metric(self) -> str:
        """The metric run reports (--hypertune-metric)."""
        return self.metrics[0][0]

    def rest_fields(self) -> dict[str, Any]:
        """studySpec and the trial counts, as HyperparameterTuningJob has them."""
        study: dict[str, Any] = {"metrics": [{"metricId": m, "goal": g} for m, g in self.metrics],
                                 "parameters": [p.to_rest() for p in self.parameters]}
        if self.algorithm != "ALGORITHM_UNSPECIFIED":
            study["algorithm"] = self.algorithm
        study["measurementSelectionType"] = self.measurement
        if self.stopping is not None:
            study[self.stopping[0]] = self.stopping[1]
        out: dict[str, Any] = {"studySpec": study, "maxTrialCount": self.max_trials,
                               "parallelTrialCount": self.parallel_trials}
        if self.max_failed_trials:
            out["maxFailedTrialCount"] = self.max_failed_trials
        return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The study options of ``job vertex-tuning``."""
    g = p.add_argument_group("study (HyperparameterTuningJob.studySpec)")
    g.add_argument("--hypertune-metric", required=True, metavar="NAME",
                   help="the metric the trials report (run's --hypertune-metric; added to the args if absent)")
    g.add_argument("--goal", required=True, type=str.upper, choices=GOALS, help="maximize or minimize it")
    g.add_argument("--metric", action="append", default=[], metavar="ID=maximize|minimize",
                   help="another metric of the study, which your code reports itself (repeatable)")
    g.add_argument("--param-double", action="append", default=[], metavar="ID=MIN:MAX[:SCALE]",
                   help="a real parameter; SCALE linear|log|reverse-log")
    g.add_argument("--param-int", action="append", default=[], metavar="ID=MIN:MAX[:SCALE]", help="an integer one")
    g.add_argument("--param-categorical", action="append", default=[], metavar="ID=A,B,...", help="a string one")
    g.add_argument("--param-discrete", action="append", default=[], metavar="ID=X,Y,...[:SCALE]",
                   help="a number from a list")
    g.add_argument("--param-condition", action="append", default=[], metavar="CHILD=PARENT:VALUE[,VALUE...]",
                   help="tune CHILD only in trials whose PARENT (integer, categorical or discrete) has one of the "
                   "VALUEs (repeatable)")
    g.add_argument("--algorithm", choices=tuple(ALGORITHMS), default="bayesian")
    g.add_argument("--measurement", choices=tuple(MEASUREMENTS), default="last",
                   help="which of a trial's reports counts: its last (default, the API's) or its best")
    g.add_argument("--early-stopping", metavar="decay-curve|median|convex[:OPTION,...]",
                   help="stop unpromising trials early; OPTION: elapsed (judge elapsed time, not steps), and for "
                   "convex max-steps=N, min-steps=N, min-measurements=N, learning-rate-parameter=ID, "
                   "update-all-stopped")
    g.add_argument("--max-trials", type=int, required=True, metavar="N")
    g.add_argument("--parallel-trials", type=int, default=1, metavar="N")
    g.add_argument("--max-failed-trials", type=int, default=0, metavar="N", help="0: Vertex AI decides")


def _metrics(ns: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    metrics = [(ns.hypertune_metric, ns.goal)]
    for text in ns.metric:
        ident, eq, goal = text.partition("=")
        if not eq or goal.upper() not in GOALS:
            raise ConfigError("--metric", "expected ID=maximize or ID=minimize")
        metrics.append((ident, goal.upper()))
    for flag, ident in [("--hypertune-metric", metrics[0][0]), *(("--metric", m) for m, _ in metrics[1:])]:
        if not ident or _WHITESPACE.search(ident):
            raise ConfigError(flag, "a metric id must not contain whitespace (StudySpec.MetricSpec.metricId)")
    ids = [m for m, _ in metrics]
    if len(set(ids)) != len(ids):
        raise ConfigError("--metric", "metric ids must be unique amongst the study's metrics")
    return tuple(metrics)


def _stopping(text: str | None, params: list[Parameter]) -> tuple[str, dict[str, Any]] | None:
    if text is None:
        return None
    kind, _, options = text.partition(":")
    if kind not in STOPPING:
        raise ConfigError("--early-stopping", f"expected one of {', '.join(STOPPING)}")
    spec: dict[str, Any] = {}
    for option in (o for o in options.split(",") if o):
        key, eq, value = option.partition("=")
        if key == "elapsed" and not eq:
            spec["useElapsedDuration"] = True
        elif kind == "convex" and key == "update-all-stopped" and not eq:
            spec["updateAllStoppedTrials"] = True
        elif kind == "convex" and key in _CONVEX and eq and value:
            if key != "learning-rate-parameter" and not value.isdigit():
                raise ConfigError("--early-stopping", f"{key}: expected a whole number")
            if key == "learning-rate-parameter" and value not in {q.parameter_id for p in params for q in p.walk()}:
                raise ConfigError("--early-stopping", "learning-rate-parameter: not one of the study's parameters")
            spec[_CONVEX[key]] = value
        else:
            raise ConfigError("--early-stopping", f"{key}: not an option of {kind} (elapsed; convex also "
                              f"{', '.join(_CONVEX)}, update-all-stopped)")
    steps = [int(spec[k]) for k in ("minStepCount", "maxStepCount") if k in spec]
    if len(steps) == 2 and steps[0] > steps[1]:
        raise ConfigError("--early-stopping", "min-steps must not exceed max-steps")
    return STOPPING[kind], spec


def study(ns: argparse.Namespace) -> tuple[Study, list[str]]:
    """The study from the parsed options, checked; and warnings."""
    flat = [parse_parameter(kind, text, f"--param-{flag}") for kind, flag, items in (
        ("double", "double", ns.param_double), ("integer", "int", ns.param_int),
        ("categorical", "categorical", ns.param_categorical), ("discrete", "discrete", ns.param_discrete))
        for text in items]
    if not flat:
        raise ConfigError("job vertex-tuning", "no parameters: give --param-double, --param-int, "
                          "--param-categorical or --param-discrete")
    ids = [p.parameter_id for p in flat]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError("job vertex-tuning", f"parameters given more than once: {', '.join(dupes)}")
    params = nest(flat, ns.param_condition)
    algorithm = ALGORITHMS[ns.algorithm]
    if algorithm == "GRID_SEARCH" and any(p.kind == "double" for p in flat):
        raise ConfigError("--algorithm", "grid search takes integer, categorical and discrete parameters only")
    if ns.max_trials < 1 or not 1 <= ns.parallel_trials <= ns.max_trials or ns.max_failed_trials < 0:
        raise ConfigError("--max-trials", "expected --max-trials >= 1, 1 <= --parallel-trials <= --max-trials, "
                          "--max-failed-trials >= 0")
    metrics = _metrics(ns)
    stopping = _stopping(ns.early_stopping, params)
    warnings = _warn_run_options(ids)
    warnings += [f"--metric {m}: run reports --hypertune-metric only; your code reports {m} itself "
                 "(entrypoint.context.report_metric), or the study waits for it" for m, _ in metrics[1:]]
    if stopping is not None and len(metrics) > 1:
        warnings.append("--early-stopping: its rules judge a trial by \"the objective value\" (StudySpec); with "
                        "several metrics Vertex AI documents none of them for which metric")
    return Study(metrics, tuple(params), algorithm, ns.max_trials, ns.parallel_trials, ns.max_failed_trials,
                 MEASUREMENTS[ns.measurement], stopping), warnings


def _warn_run_options(ids: list[str]) -> list[str]:
    parser = argparse.ArgumentParser(add_help=False)
    add_run_arguments(parser)
    run_flags = {o for a in parser._actions for o in a.option_strings}
    return [f"parameter {i}: Vertex AI appends --{i}=VALUE after the args' '--', so your code gets it, not "
            f"run's own --{i}" for i in ids if f"--{i}" in run_flags]
