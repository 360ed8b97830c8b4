"""A tuning job's parameters (StudySpec.ParameterSpec): ranges, lists, scales, conditions; and one trial's values.

Rules from the API's StudySpec (google.cloud.aiplatform.v1 study.proto, also
https://cloud.google.com/vertex-ai/docs/reference/rest/v1/StudySpec): a parameter id "must not contain whitespaces
and must be unique"; UNIT_LOG_SCALE and UNIT_REVERSE_LOG_SCALE need "the entire feasible space ... strictly
positive"; discrete values increasing, at most 1,000; a conditional parameter hangs under a DISCRETE, INTEGER or
CATEGORICAL parent, its parent values "must exist in" (lie in) the parent's values. ``local --spec`` runs one trial
with the values ``trial_values`` picks, a conditional parameter only where its parent's value matches.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from entrypoint.errors import ConfigError

SCALES = {"linear": "UNIT_LINEAR_SCALE", "log": "UNIT_LOG_SCALE", "reverse-log": "UNIT_REVERSE_LOG_SCALE"}
PARENT_KINDS = {"integer": "parentIntValues", "discrete": "parentDiscreteValues",
                "categorical": "parentCategoricalValues"}
MAX_DISCRETE = 1000
_PARAM_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class Parameter:
    """One StudySpec.ParameterSpec: kind is double, integer, categorical or discrete; children hang under values."""

    parameter_id: str
    kind: str
    low: float | None = None
    high: float | None = None
    values: tuple[str, ...] = ()
    scale: str | None = None
    children: tuple[tuple[tuple[str, ...], Parameter], ...] = ()  # (parent values, the conditional parameter)

    def to_rest(self) -> dict[str, Any]:
        """The ParameterSpec, camelCase (int64 bounds and values as proto JSON's strings)."""
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
        if self.children:
            spec["conditionalParameterSpecs"] = [
                {PARENT_KINDS[self.kind]: {"values": self.parent_values(values)}, "parameterSpec": child.to_rest()}
                for values, child in self.children]
        return spec

    def parent_values(self, values: tuple[str, ...]) -> list[Any]:
        """A condition's values as the API types them for this (parent) parameter."""
        if self.kind == "integer":
            return [str(int(float(v))) for v in values]
        if self.kind == "discrete":
            return [float(v) for v in values]
        return list(values)

    def walk(self) -> list[Parameter]:
        """This parameter and every conditional one under it."""
        return [self, *(p for _, child in self.children for p in child.walk())]


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


def _range(kind: str, ident: str, rest: str, flag: str) -> Parameter:
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


def parse_parameter(kind: str, text: str, flag: str) -> Parameter:
    """``ID=MIN:MAX[:SCALE]`` (double, integer), ``ID=A,B,...`` (categorical), ``ID=X,Y,...[:SCALE]`` (discrete)."""
    ident, eq, rest = text.partition("=")
    if not eq or not _PARAM_ID.fullmatch(ident):
        raise ConfigError(flag, "expected ID=..., the ID a letter then letters, digits, '_' or '-'")
    if kind in ("double", "integer"):
        return _range(kind, ident, rest, flag)
    values_text, _, scale_text = rest.partition(":") if kind == "discrete" else (rest, "", "")
    values = tuple(v for v in values_text.split(",") if v)
    if not values or len(set(values)) != len(values):
        raise ConfigError(flag, f"{ident}: expected distinct values A,B,...")
    if kind == "categorical":
        if rest.rpartition(":")[2] in SCALES:  # --param-discrete's syntax, where a scale has no meaning
            raise ConfigError(flag, f"{ident}: categorical values have no scale (StudySpec's scaleType is for "
                              "double, integer and discrete parameters), and the last value ends with one: drop "
                              f"':{rest.rpartition(':')[2]}'")
        return Parameter(ident, kind, values=values)
    numbers = [_number(v, flag, ident) for v in values]
    if numbers != sorted(numbers) or len(numbers) > MAX_DISCRETE:
        raise ConfigError(flag, f"{ident}: discrete values must be in increasing order, at most {MAX_DISCRETE}")
    scale = _scale(scale_text, flag, ident) if scale_text else "UNIT_LINEAR_SCALE"
    if scale != "UNIT_LINEAR_SCALE" and numbers[0] <= 0:
        raise ConfigError(flag, f"{ident}: a log scale needs every value > 0 (the feasible space must be strictly "
                          "positive)")
    return Parameter(ident, kind, values=tuple(repr(n) if not n.is_integer() else str(int(n)) for n in numbers),
                     scale=scale)


def _condition_values(parent: Parameter, values: tuple[str, ...], child: str) -> tuple[str, ...]:
    """The parent's values a condition names: in its list, or whole numbers in its range."""
    flag = "--param-condition"
    if parent.kind == "double":
        raise ConfigError(flag, f"{child}: its parent {parent.parameter_id} is a double; a condition's parent is an "
                          "integer, categorical or discrete parameter")
    for value in values:
        if parent.kind == "categorical" and value not in parent.values:
            raise ConfigError(flag, f"{child}: a value is not one of {parent.parameter_id}'s values")
        if parent.kind == "discrete" and not any(
                abs(_number(value, flag, child) - float(v)) <= 1e-10 for v in parent.values):
            raise ConfigError(flag, f"{child}: a value is not one of {parent.parameter_id}'s values")
        if parent.kind == "integer":
            number = _number(value, flag, child)
            if not number.is_integer() or not (parent.low or 0) <= number <= (parent.high or 0):
                raise ConfigError(flag, f"{child}: a value is not a whole number in {parent.parameter_id}'s range")
    return values


def nest(parameters: list[Parameter], conditions: list[str]) -> list[Parameter]:
    """``CHILD=PARENT:V1[,V2...]`` conditions applied: each child moves under its parent (nested; no cycles)."""
    by_id = {p.parameter_id: p for p in parameters}
    parents: dict[str, tuple[str, tuple[str, ...]]] = {}
    for text in conditions:
        child, eq, rest = text.partition("=")
        parent, colon, values = rest.partition(":")
        listed = tuple(v for v in values.split(",") if v)
        if not (eq and colon and listed) or child not in by_id or parent not in by_id or child == parent:
            raise ConfigError("--param-condition", "expected CHILD=PARENT:VALUE[,VALUE...], both parameters given "
                              "with --param-*")
        if child in parents:
            raise ConfigError("--param-condition", f"{child}: one condition per parameter")
        parents[child] = (parent, _condition_values(by_id[parent], listed, child))

    def built(ident: str, seen: tuple[str, ...]) -> Parameter:
        if ident in seen:
            raise ConfigError("--param-condition", f"{ident}: conditions in a circle")
        kids = tuple((values, built(c, (*seen, ident))) for c, (p, values) in parents.items() if p == ident)
        return replace(by_id[ident], children=kids)

    roots = [built(p.parameter_id, ()) for p in parameters if p.parameter_id not in parents]
    reached = {q.parameter_id for p in roots for q in p.walk()}
    if reached != set(by_id):
        raise ConfigError("--param-condition", f"{', '.join(sorted(set(by_id) - reached))}: conditions in a circle")
    return roots


def trial_values(parameters: list[dict[str, Any]], source: str, path: str = "studySpec.parameters") -> list[
        tuple[str, str]]:
    """One trial's values for a local run: the middle of each range (in its scale), the first of each list; a
    conditional parameter where its parent's value is one of its condition's."""
    out = []
    for i, spec in enumerate(parameters):
        at = f"{path}[{i}]"
        if not isinstance(spec, dict):
            raise ConfigError(source, "must be an object", at)
        ident = spec.get("parameterId") or spec.get("parameter_id")
        if not isinstance(ident, str) or not ident:
            raise ConfigError(source, "missing", f"{at}.parameterId")
        value = _middle(spec, source, at)
        out.append((ident, value))
        conditionals = spec.get("conditionalParameterSpecs", spec.get("conditional_parameter_specs")) or []
        for j, cond in enumerate(conditionals if isinstance(conditionals, list) else []):
            child = cond.get("parameterSpec", cond.get("parameter_spec")) if isinstance(cond, dict) else None
            if isinstance(child, dict) and _matches(cond, value):
                out += trial_values([child], source, f"{at}.conditionalParameterSpecs[{j}].parameterSpec")
    return out


def _matches(condition: dict[str, Any], value: str) -> bool:
    for camel in PARENT_KINDS.values():
        snake = re.sub(r"([A-Z])", r"_\1", camel).lower()
        found = condition.get(camel, condition.get(snake))
        if isinstance(found, dict) and isinstance(found.get("values"), list):
            if camel == "parentCategoricalValues":
                return value in [str(v) for v in found["values"]]
            try:
                return any(abs(float(v) - float(value)) <= 1e-10 for v in found["values"])
            except (TypeError, ValueError):
                return False
    return False


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
