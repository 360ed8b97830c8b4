"""``job vertex-tuning``: a HyperparameterTuningJob whose trials are the CustomJob ``job vertex`` would write.

Vertex AI runs each trial as that CustomJob with the trial's values added to the container args as
``--<parameterId>`` arguments (https://cloud.google.com/vertex-ai/docs/training/using-hyperparameter-tuning),
after the run args: so the run args must end with their own ``--`` section, where the user's code reads
them. ``local --spec`` runs one trial of such a job with the values ``trial_values`` picks.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.planning.runargs import add_run_arguments

GOALS = ("MAXIMIZE", "MINIMIZE")
ALGORITHMS = {"bayesian": "ALGORITHM_UNSPECIFIED", "grid": "GRID_SEARCH", "random": "RANDOM_SEARCH"}
SCALES = {"linear": "UNIT_LINEAR_SCALE", "log": "UNIT_LOG_SCALE", "reverse-log": "UNIT_REVERSE_LOG_SCALE"}
_PARAM_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class Parameter:
    """One StudySpec.ParameterSpec: kind is double, integer, categorical or discrete."""

    parameter_id: str
    kind: str
    low: float | None = None
    high: float | None = None
    values: tuple[str, ...] = ()
    scale: str | None = None

    def to_rest(self) -> dict[str, Any]:
        """The ParameterSpec, camelCase (int64 bounds as proto JSON's strings)."""
        spec: dict[str, Any] = {"parameterId": self.parameter_id}
        if self.kind == "double":
            spec["doubleValueSpec"] = {"minValue": self.low, "maxValue": self.high}
        elif self.kind == "integer":
            spec["integerValueSpec"] = {"minValue": str(int(self.low or 0)), "maxValue": str(int(self.high or 0))}
        elif self.kind == "categorical":
            spec["categoricalValueSpec"] = {"values": list(self.values)}
        else:
            spec["discreteValueSpec"] = {"values": [float(v) for v in self.values]}
        if self.scale:
            spec["scaleType"] = self.scale
        return spec


@dataclass(frozen=True)
class Study:
    """The study and trial counts of a tuning job."""

    metric: str
    goal: str
    parameters: tuple[Parameter, ...]
    algorithm: str
    max_trials: int
    parallel_trials: int
    max_failed_trials: int

    def rest_fields(self) -> dict[str, Any]:
        """studySpec and the trial counts, as HyperparameterTuningJob has them."""
        study: dict[str, Any] = {"metrics": [{"metricId": self.metric, "goal": self.goal}],
                                 "parameters": [p.to_rest() for p in self.parameters]}
        if self.algorithm != "ALGORITHM_UNSPECIFIED":
            study["algorithm"] = self.algorithm
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
    g.add_argument("--param-double", action="append", default=[], metavar="ID=MIN:MAX[:SCALE]",
                   help="a real parameter; SCALE linear|log|reverse-log")
    g.add_argument("--param-int", action="append", default=[], metavar="ID=MIN:MAX[:SCALE]", help="an integer one")
    g.add_argument("--param-categorical", action="append", default=[], metavar="ID=A,B,...", help="a string one")
    g.add_argument("--param-discrete", action="append", default=[], metavar="ID=X,Y,...[:SCALE]",
                   help="a number from a list")
    g.add_argument("--algorithm", choices=tuple(ALGORITHMS), default="bayesian")
    g.add_argument("--max-trials", type=int, required=True, metavar="N")
    g.add_argument("--parallel-trials", type=int, default=1, metavar="N")
    g.add_argument("--max-failed-trials", type=int, default=0, metavar="N", help="0: Vertex AI decides")


def _number(text: str, flag: str, ident: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(flag, f"{ident}: expected numbers") from None
    if not math.isfinite(value):
        raise ConfigError(flag, f"{ident}: expected finite numbers")
    return value


def _scale(text: str, flag: str, ident: str) -> str:
    if text not in SCALES:
        raise ConfigError(flag, f"{ident}: scale is one of {', '.join(SCALES)}")
    return SCALES[text]


def _parameter(kind: str, text: str, flag: str) -> Parameter:
    ident, eq, rest = text.partition("=")
    if not eq or not _PARAM_ID.fullmatch(ident):
        raise ConfigError(flag, "expected ID=..., the ID a letter then letters, digits, '_' or '-'")
    if kind in ("double", "integer"):
        parts = rest.split(":")
        if len(parts) not in (2, 3):
            raise ConfigError(flag, f"{ident}: expected MIN:MAX[:SCALE]")
        low, high = (_number(x, flag, ident) for x in parts[:2])
        if kind == "integer" and not (low.is_integer() and high.is_integer()):
            raise ConfigError(flag, f"{ident}: bounds must be whole numbers")
        if low >= high:
            raise ConfigError(flag, f"{ident}: MIN must be below MAX")
        scale = _scale(parts[2], flag, ident) if len(parts) == 3 else "UNIT_LINEAR_SCALE"
        if scale != "UNIT_LINEAR_SCALE" and low <= 0:
            raise ConfigError(flag, f"{ident}: a log scale needs MIN > 0")
        return Parameter(ident, kind, low, high, scale=scale)
    values_text, _, scale_text = rest.partition(":") if kind == "discrete" else (rest, "", "")
    values = tuple(v for v in values_text.split(",") if v)
    if not values or len(set(values)) != len(values):
        raise ConfigError(flag, f"{ident}: expected distinct values A,B,...")
    if kind == "categorical":
        return Parameter(ident, kind, values=values)
    numbers = [_number(v, flag, ident) for v in values]
    if numbers != sorted(numbers):
        raise ConfigError(flag, f"{ident}: discrete values must be in increasing order")
    scale = _scale(scale_text, flag, ident) if scale_text else "UNIT_LINEAR_SCALE"
    return Parameter(ident, kind, values=tuple(repr(n) if not n.is_integer() else str(int(n)) for n in numbers),
                     scale=scale)


def study(ns: argparse.Namespace) -> tuple[Study, list[str]]:
    """The study from the parsed options, checked; and warnings."""
    params = [_parameter(kind, text, f"--param-{flag}") for kind, flag, items in (
        ("double", "double", ns.param_double), ("integer", "int", ns.param_int),
        ("categorical", "categorical", ns.param_categorical), ("discrete", "discrete", ns.param_discrete))
        for text in items]
    if not params:
        raise ConfigError("job vertex-tuning", "no parameters: give --param-double, --param-int, "
                          "--param-categorical or --param-discrete")
    ids = [p.parameter_id for p in params]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError("job vertex-tuning", f"parameters given more than once: {', '.join(dupes)}")
    algorithm = ALGORITHMS[ns.algorithm]
    if algorithm == "GRID_SEARCH" and any(p.kind == "double" for p in params):
        raise ConfigError("--algorithm", "grid search takes integer, categorical and discrete parameters only")
    if ns.max_trials < 1 or not 1 <= ns.parallel_trials <= ns.max_trials or ns.max_failed_trials < 0:
        raise ConfigError("--max-trials", "expected --max-trials >= 1, 1 <= --parallel-trials <= --max-trials, "
                          "--max-failed-trials >= 0")
    warnings = _warn_run_options(ids)
    return Study(ns.hypertune_metric, ns.goal, tuple(params), algorithm, ns.max_trials, ns.parallel_trials,
                 ns.max_failed_trials), warnings


def _warn_run_options(ids: list[str]) -> list[str]:
    parser = argparse.ArgumentParser(add_help=False)
    add_run_arguments(parser)
    run_flags = {o for a in parser._actions for o in a.option_strings}
    return [f"parameter {i}: Vertex AI appends --{i}=VALUE after the args' '--', so your code gets it, not "
            f"run's own --{i}" for i in ids if f"--{i}" in run_flags]


def trial_values(parameters: list[dict[str, Any]], source: str) -> list[tuple[str, str]]:
    """One trial's values for a local run: the middle of each range (in its scale), the first of each list."""
    out = []
    for i, spec in enumerate(parameters):
        path = f"studySpec.parameters[{i}]"
        ident = spec.get("parameterId") or spec.get("parameter_id")
        if not isinstance(ident, str) or not ident:
            raise ConfigError(source, "missing", f"{path}.parameterId")
        out.append((ident, _middle(spec, source, path)))
    return out


def _middle(spec: dict[str, Any], source: str, path: str) -> str:
    def get(*names: str) -> Any:
        return next((spec[n] for n in names if n in spec), None)

    log = get("scaleType", "scale_type") == "UNIT_LOG_SCALE"
    for names, integer in ((("doubleValueSpec", "double_value_spec"), False),
                           (("integerValueSpec", "integer_value_spec"), True)):
        bounds = get(*names)
        if isinstance(bounds, dict):
            raw: tuple[Any, Any] = (bounds.get("minValue", bounds.get("min_value")),
                                    bounds.get("maxValue", bounds.get("max_value")))
            try:
                low, high = float(raw[0]), float(raw[1])
            except (TypeError, ValueError):
                raise ConfigError(source, "expected minValue and maxValue numbers", f"{path}.{names[0]}") from None
            mid = math.sqrt(low * high) if log and low > 0 else (low + high) / 2
            return str(round(mid)) if integer else repr(mid)
    for names in (("categoricalValueSpec", "categorical_value_spec"), ("discreteValueSpec", "discrete_value_spec")):
        choice = get(*names)
        if isinstance(choice, dict) and isinstance(choice.get("values"), list) and choice["values"]:
            first = choice["values"][0]
            return str(int(first)) if isinstance(first, float) and first.is_integer() else str(first)
    raise ConfigError(source, "expected a double, integer, categorical or discrete value spec", path)
