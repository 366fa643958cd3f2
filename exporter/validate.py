"""The one way gpufleet checks input: a value and the key it sits at in, one line naming the key out.

Four pieces, one shape (``check(value, key)``, the key dotted and indexed as a user
reads it: ``nodes[3].gpu_count``, ``sources.sim.seed``):

- **JSON checks** for the API's bodies (:mod:`exporter.advisor.bounds`): :func:`string`,
  :func:`integer`, :func:`number`, :func:`boolean`, :func:`optional`, :func:`array` and
  :func:`record` raise :class:`Invalid` and quote a value as JSON. Each also knows its
  JSON Schema (:func:`json_schema`), made from the same numbers, for the OpenAPI
  document: a limit is written once.
- **File checks** for what a user writes in YAML (the config, the web config, the
  threshold table): :func:`mapping`, :func:`text`, :func:`line`, :func:`true_or_false`,
  :func:`one_of`, :func:`quantity`, :func:`share`, :func:`whole`, :func:`duration` raise
  :class:`~exporter.errors.ConfigError` and quote a value as Python does
  (:func:`~exporter.errors.quoted`), the wording node_exporter's users know. The loader of
  a file puts the file's name in front (``thresholds.yaml: alerts[0].op: ...``).
- **Command-line numbers** (:func:`flag_number`): finite and within the flag's stated
  bounds, else :class:`~exporter.errors.UsageError` (one line, exit 2).
- **Records** (:class:`Builder`): a frozen dataclass built from a mapping by its fields'
  types (nested records, tuples of them, optionals), refusing an unknown key and a
  missing required one by name; each caller says how a leaf value is checked. The
  config and the snapshot's JSON form (:func:`exporter.snapshot.from_json`) are built so.

Bounds come first, as everywhere: a JSON check refuses a string or an array by its size
before it looks inside (the YAML reader has bounded a file's aliases and depth before
these run), and an error quotes at most 40 (JSON) or 80 (files) characters of a value,
so a 16 MB value is never formatted whole.

A leaf module, importing only :mod:`exporter.errors` and :mod:`exporter.durations`: the
snapshot, the config, the threshold table and the advisor all use it, and none of them
imports another through it.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from exporter.durations import HINT as DURATION_HINT
from exporter.durations import parse_duration
from exporter.errors import ConfigError, UsageError, quoted

# -- JSON checks (the API's bodies) --------------------------------------------------------

MAX_STRING = 1024


class Invalid(ValueError):
    """A body the advisor refuses with 400; ``str()`` is the one-line reason."""


def show(value: Any) -> str:
    """A value as an error quotes it: at most 40 characters, so a reason stays one short line."""
    if isinstance(value, str):
        value = value[:41]  # quote a 16 MB string by its start, not whole
    text = json.dumps(value) if isinstance(value, str | int | float | bool | None) else type(value).__name__
    return text if len(text) <= 40 else f"{text[:37]}..."


Check = Callable[[Any, str], None]

# The JSON Schema (2020-12) of each check, built on demand: record()'s field table can
# gain entries after the record is made (Gpu.mig in bounds), so it is read when asked for.
# Weak keys: a check made for one call and dropped leaves nothing behind.
SCHEMAS: weakref.WeakKeyDictionary[Check, Callable[[], dict[str, Any]]] = weakref.WeakKeyDictionary()


def described(check: Check, schema: Callable[[], dict[str, Any]]) -> Check:
    """``check``, registered with the JSON Schema that says what it accepts."""
    SCHEMAS[check] = schema
    return check


def json_schema(check: Check) -> dict[str, Any]:
    """What ``check`` accepts, as JSON Schema; what a schema cannot say (duplicate node
    names, placements over all allocations, nesting, digits) only the check enforces."""
    return SCHEMAS[check]()


def string(limit: int = MAX_STRING) -> Check:
    def check(value: Any, path: str) -> None:
        if not isinstance(value, str):
            raise Invalid(f"{path}: must be a string, got {show(value)}")
        if len(value) > limit:
            raise Invalid(f"{path}: a string of {len(value)} characters (at most {limit})")
    return described(check, lambda: {"type": "string", "maxLength": limit})


def integer(low: int, high: int) -> Check:
    def check(value: Any, path: str) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise Invalid(f"{path}: must be an integer from {low} to {high}, got {show(value)}")
    return described(check, lambda: {"type": "integer", "minimum": low, "maximum": high})


def number(low: float, high: float, above: bool = False) -> Check:
    """A number in [low, high], or in (low, high] when ``above``."""
    span = f"above {low:g} and at most {high:g}" if above else f"from {low:g} to {high:g}"

    def check(value: Any, path: str) -> None:
        # ints too: JSON has one number type. The parser already refused NaN and infinities.
        if (not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high
                or (above and value == low)):
            raise Invalid(f"{path}: must be a number {span}, got {show(value)}")
    return described(check, lambda: {"type": "number", ("exclusiveMinimum" if above else "minimum"): low,
                                      "maximum": high})


def boolean(value: Any, path: str) -> None:
    if not isinstance(value, bool):
        raise Invalid(f"{path}: must be true or false, got {show(value)}")


described(boolean, lambda: {"type": "boolean"})


def optional(inner: Check) -> Check:
    def check(value: Any, path: str) -> None:
        if value is not None:
            inner(value, path)
    return described(check, lambda: {"anyOf": [json_schema(inner), {"type": "null"}]})


def array(item: Check, limit: int) -> Check:
    def check(value: Any, path: str) -> None:
        if not isinstance(value, list):
            raise Invalid(f"{path}: must be an array, got {show(value)}")
        if len(value) > limit:
            raise Invalid(f"{path}: {len(value)} items (at most {limit})")
        for i, element in enumerate(value):
            item(element, f"{path}[{i}]")
    return described(check, lambda: {"type": "array", "items": json_schema(item), "maxItems": limit})


def required_fields(cls: type) -> list[str]:
    """The fields of dataclass ``cls`` without a default: a record must give each."""
    return [f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def record(cls: type, fields: dict[str, Check]) -> Check:
    """An object holding ``cls``'s fields: those without a default are required, no others allowed."""
    required = required_fields(cls)

    def check(value: Any, path: str) -> None:
        prefix = f"{path}." if path else ""
        if not isinstance(value, dict):
            raise Invalid(f"{path or 'body'}: must be an object, got {show(value)}")
        for name in required:
            if name not in value:
                raise Invalid(f"{prefix}{name}: required")
        for name, element in value.items():
            rule = fields.get(name)
            if rule is None:
                raise Invalid(f"{prefix}{name[:40]}: unknown field of {cls.__name__}")
            rule(element, prefix + name)
    return described(check, lambda: {
        "type": "object", "title": cls.__name__, "required": required, "additionalProperties": False,
        "properties": {name: json_schema(rule) for name, rule in fields.items()}})


# -- file checks (YAML a user wrote) ---------------------------------------------------------


def join(prefix: str, key: object) -> str:
    """The dotted key of ``key`` under ``prefix``."""
    return f"{prefix}.{key}" if prefix else str(key)


def refuse_unknown(data: Mapping[Any, Any], allowed: Any, prefix: str) -> None:
    """ConfigError naming the first key of ``data`` not in ``allowed``, and what is."""
    for key in data:
        if key not in allowed:
            raise ConfigError(f"{join(prefix, key)}: unknown key (allowed: {', '.join(allowed)})")


def mapping(value: Any, key: str, allowed: tuple[str, ...] | None,
            required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A YAML mapping with text keys (only ``allowed`` ones, unless None; each of
    ``required``); nothing under the key (``tls_server_config:``) is an empty one. A scalar
    key is text, as yaml.v2 reads it."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: must be a mapping, got {quoted(value)}")
    for k in value:
        if not isinstance(k, str | int | float):
            raise ConfigError(f"{key}: keys must be strings, got {quoted(k)}")
    if allowed is not None:
        refuse_unknown(value, allowed, key)
    out = {text(k, key, scalars=True): v for k, v in value.items()}
    for name in required:
        if name not in out:
            raise ConfigError(f"{join(key, name)}: required")
    return out


def text(value: Any, key: str, scalars: bool = False) -> str:
    """A string; with ``scalars``, a number or boolean is taken as the text YAML read it
    from (yaml.v2, which exporter-toolkit uses, does so for a string field)."""
    if scalars and isinstance(value, bool):
        return "true" if value else "false"
    if scalars and isinstance(value, int | float):
        return str(value)
    if not isinstance(value, str):
        raise ConfigError(f"{key}: must be a string, got {quoted(value)}")
    return value


def line(value: Any, key: str) -> str:
    """A non-empty string read as one line: each run of white space (a folded YAML block's
    line breaks too) is one space."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key}: must be a non-empty string, got {quoted(value)}")
    return " ".join(value.split())


def true_or_false(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: must be true or false, got {quoted(value)}")
    return value


def one_of(value: Any, key: str, choices: Any) -> Any:
    """``value`` if it is one of ``choices`` (a tuple, or a mapping's keys)."""
    if value not in choices:
        raise ConfigError(f"{key}: must be one of {', '.join(choices)}, got {quoted(value)}")
    return value


def quantity(value: Any, key: str, unit: str, bounds: tuple[float, float], *,
             percent: bool = False) -> float:
    """A number in ``unit`` within ``bounds`` (inclusive); with ``percent``, a percentage
    such as ``30%`` too, read as 0.3. A boolean is no number; NaN is within no bounds."""
    if percent and isinstance(value, str) and value.strip().endswith("%"):
        try:
            number = float(value.strip()[:-1]) / 100
        except ValueError:
            raise ConfigError(f"{key}: must be a number or a percentage, got {quoted(value)}") from None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = value
    else:
        shape = "a number or a percentage such as 30%" if percent else "a number"
        raise ConfigError(f"{key}: must be {shape} ({unit}), got {quoted(value)}")
    low, high = bounds
    if not low <= number <= high:  # before float(): an int of 400 digits has no float
        raise ConfigError(f"{key}: must be between {low:g} and {high:g} ({unit}), got {quoted(value)}")
    return float(number)


def share(value: Any, key: str) -> float:
    """A ratio above 0 and at most 1 (a scaling band, a target)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ConfigError(f"{key}: must be a ratio in (0, 1], got {quoted(value)}")
    return float(value)


def whole(value: Any, key: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{key}: must be a whole number from {low} to {high:,}, got {quoted(value)}")
    return value


def duration(value: Any, key: str) -> float:
    """Seconds of a duration in Prometheus' grammar (``1h30m``): the rules hand the
    threshold table's durations to Prometheus as they are written."""
    try:
        return parse_duration(value)
    except ValueError:
        raise ConfigError(f"{key}: must be {DURATION_HINT}, got {quoted(value)}") from None


# -- command-line numbers ----------------------------------------------------------------------


def flag_number(value: float, flag: str, low: float, high: float, *, above: bool = False,
                unit: str = "") -> float:
    """``value`` of ``flag`` when it is finite and within [low, high] ((low, high] when
    ``above``), else :class:`~exporter.errors.UsageError` saying the bounds: one line, exit 2.
    NaN fails every comparison, so it is refused with the rest; a bound is there because
    the work grows with the number (``simulate --days 1e9`` asked for 179 GiB)."""
    inside = low < value <= high if above else low <= value <= high
    if not inside:
        raise UsageError(f"{flag}: must be in {'(' if above else '['}{_number(low)}, "
                         f"{_number(high)}]{unit}, got {_number(value)}")
    return value


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else quoted(value)


# -- records: dataclasses built from mappings -------------------------------------------------

Leaf = Callable[[Any, Any, str, Mapping[str, Any]], Any]  # (type, value, key, field metadata)


Convert = Callable[[Any, str], Any]  # (value, key) -> the field's value


class Builder:
    """Builds a dataclass from a mapping by its fields' types, naming the key of each fault.

    A field whose type is a dataclass is built from a mapping under it; ``tuple[X, ...]``
    from a list, each item as X; ``X | None`` takes None; anything else goes to ``leaf``,
    which checks and converts it. ``unknown`` words an unknown key (``str.format`` with
    ``where``, the key's path, ``name``, its repr, ``record``, the class's name, and
    ``allowed``). With ``run_checks``, a built object's ``check(prefix)`` method runs last:
    the rules between fields (``clear_below < trigger``).

    Each field's conversion is worked out once per class from its type, so a snapshot of
    100,000 GPUs costs a call per value, not a look at its type.
    """

    def __init__(self, leaf: Leaf, error: type[Exception],
                 unknown: str = "{where}: unknown key (allowed: {allowed})",
                 run_checks: bool = False) -> None:
        self._leaf = leaf
        self._error = error
        self._unknown = unknown
        self._run_checks = run_checks
        self._plans: dict[type, dict[str, tuple[Convert, bool]]] = {}

    def _plan(self, cls: type) -> dict[str, tuple[Convert, bool]]:
        """Per field: how its value is converted, and whether it is required."""
        plan = self._plans.get(cls)
        if plan is None:
            hints, required = typing.get_type_hints(cls), required_fields(cls)
            plan = self._plans[cls] = {
                f.name: (self.converter(hints[f.name], dict(f.metadata)), f.name in required)
                for f in dataclasses.fields(cls)}
        return plan

    def build(self, cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
        """``cls`` from ``data``, whose keys are ``prefix``'s children."""
        plan = self._plan(cls)
        for key in data:  # every key first: a typo is named before any value is looked at
            if key not in plan:
                raise self._error(self._unknown.format(
                    where=join(prefix, key), name=repr(key)[:80], record=cls.__name__,
                    allowed=", ".join(plan)))
        kwargs = {}
        for name, (convert, required) in plan.items():  # in the fields' order
            if name in data:
                kwargs[name] = convert(data[name], join(prefix, name))
            elif required:
                raise self._error(f"{join(prefix, name)}: required")
        built = cls(**kwargs)
        if self._run_checks and (check := getattr(built, "check", None)) is not None:
            check(prefix)
        return built

    def converter(self, tp: Any, meta: Mapping[str, Any]) -> Convert:
        """How a value of type ``tp`` is checked and converted."""
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            inner = self.converter(next(a for a in typing.get_args(tp) if a is not type(None)), meta)
            return lambda value, key: None if value is None else inner(value, key)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            def nested(value: Any, key: str) -> Any:
                if not isinstance(value, Mapping):
                    raise self._error(f"{key}: must be a mapping, got {type(value).__name__}")
                return self.build(tp, value, key)
            return nested
        if origin is tuple:
            # each item of a list of URLs is a URL
            item = self.converter(typing.get_args(tp)[0], {"url": meta["url"]} if "url" in meta else {})

            def items(value: Any, key: str) -> tuple[Any, ...]:
                if not isinstance(value, list | tuple):
                    raise self._error(f"{key}: must be a list, got {type(value).__name__}")
                return tuple(item(v, f"{key}[{i}]") for i, v in enumerate(value))
            return items
        leaf = self._leaf
        return lambda value, key: leaf(tp, value, key, meta)


__all__ = [
    "SCHEMAS", "Builder", "Check", "Invalid", "array", "boolean", "described", "duration",
    "flag_number", "integer", "join", "json_schema", "line", "mapping", "number", "one_of", "optional",
    "quantity", "record", "refuse_unknown", "required_fields", "share", "show", "string", "text",
    "true_or_false", "whole",
]
