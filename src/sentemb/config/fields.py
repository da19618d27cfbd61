"""Typed settings declared once: ``arg()`` fields of a dataclass give each setting its default, type,
allowed values, bounds and one-line help. From that one declaration follow the JSON-schema part of
the config (``schema_of``), validation of a mapping with errors naming the key (``check_mapping``),
the typed object (``build``) and the listings (``sentemb methods``, ``sentemb config-keys``).

Used by the method arguments (``Method.Args``) and by the workflow settings (``sentemb.config.settings``).
No dependency beyond the standard library.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Sequence

from .. import SentembError


def arg(default: Any, help: str, choices: Sequence[Any] | None = None, *, minimum: float | None = None,
        maximum: float | None = None, exclusive_minimum: float | None = None,
        exclusive_maximum: float | None = None, pattern: str | None = None, min_items: int | None = None,
        weights: bool = True, required: bool = False, key_pattern: str | None = None,
        schema: Any = None) -> Any:
    """Declare one setting: ``temperature: float = arg(0.05, "τ of Eq. 1", exclusive_minimum=0)``.
    ``choices`` are the allowed values (of each item, for a list); the bounds are JSON-schema's and
    are enforced wherever the setting is given (``check_mapping``: the config's ``methods.<name>``,
    ``runs[i].method_args``, study values), with the error naming the key. A mutable default
    (list, dict, a settings dataclass) is copied for every instance. ``weights=False``: the setting
    does not change what is trained (how often to log, threads, where batches are built), so it is
    left out of the run's fingerprint (``sentemb.config.settings.fingerprint``): changing it reruns no job
    and a saved state still resumes.

    For the config tree (``sentemb.config.settings.Config``): ``required`` - the key must be given (no
    default in the schema; the field's default is only a placeholder); ``key_pattern`` - the names
    of a mapping's entries (``backbones``); ``min_items`` - items of a list or entries of a mapping;
    ``schema`` - a callable giving the property's JSON schema where the type cannot say it (a
    ``runs[].train`` override: the train keys without their defaults)."""
    meta = {"help": help, "choices": tuple(choices) if choices else None, "minimum": minimum, "maximum": maximum,
            "exclusive_minimum": exclusive_minimum, "exclusive_maximum": exclusive_maximum, "pattern": pattern,
            "min_items": min_items, "weights": weights, "required": required, "key_pattern": key_pattern,
            "schema": schema}
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ArgSpec:
    """One declared setting, as ``sentemb methods`` and ``sentemb config-keys`` list it."""

    name: str
    type: str
    default: Any
    help: str
    choices: tuple | None


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if _is_union(tp):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        return getattr(origin, "__name__", str(origin))
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _is_union(tp: Any) -> bool:
    return isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union


def check_value(value: Any, tp: Any) -> bool:
    """Does ``value`` (from YAML/JSON) fit the annotation ``tp``? int is a float; bool is neither."""
    origin = typing.get_origin(tp)
    if _is_union(tp):
        return any(check_value(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is Any:
        return True
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is bool:
        return isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        inner = typing.get_args(tp)
        return not inner or all(check_value(v, inner[0]) for v in value)
    if origin is dict or tp is dict or dataclasses.is_dataclass(tp):
        return isinstance(value, dict)
    return isinstance(value, tp) if isinstance(tp, type) else True


KIND = {float: "a number", int: "an integer", bool: "true or false", str: "a string"}


def fields(cls_or_obj) -> list[dataclasses.Field]:
    """The declared settings (fields not marked ``internal``)."""
    return [f for f in dataclasses.fields(cls_or_obj) if not f.metadata.get("internal")]


def default_of(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


@functools.lru_cache(maxsize=None)
def _declared(cls: type) -> dict[str, tuple[dataclasses.Field, Any, str]]:
    """name -> (field, annotation, its type name) of the declared settings of dataclass ``cls``, in
    declaration order, worked out once per class: resolving the annotations is most of what checking
    a mapping costs, and the paper configuration's ``snakemake -n`` checks about 17,000 of them.
    (A plug-in's file edited and imported again is a new class, so it is never served stale.)"""
    hints = hints_of(cls)
    return {f.name: (f, hints[f.name], type_name(hints[f.name])) for f in fields(cls)}


def _class_of(cls_or_obj: Any) -> type:
    return cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)


def specs(cls: type) -> list[ArgSpec]:
    """The declared settings of dataclass ``cls``, in declaration order (each default a fresh copy)."""
    return [ArgSpec(name, tn, default_of(f), f.metadata.get("help", ""), f.metadata.get("choices"))
            for name, (f, _, tn) in _declared(_class_of(cls)).items()]


def check_mapping(cls: type, values: Any, where: str, owner: str) -> None:
    """Check user-given ``values`` against the fields of ``cls`` (names, types, allowed values);
    errors name the key (``where.<name>``). ``owner`` says whose setting it is (unknown names)."""
    if not isinstance(values, dict):
        raise SentembError(f"{where}: must be a mapping of argument names to values, not {type(values).__name__}")
    declared = _declared(_class_of(cls))
    for key, value in values.items():
        if key not in declared:
            raise SentembError(f"{where}.{key}: unknown argument of {owner} (known: {', '.join(declared)})")
        f, tp, tn = declared[key]
        if not check_value(value, tp):
            kind = KIND.get(tp, f"of type {tn}")
            raise SentembError(f"{where}.{key}: {value!r} is not {kind}")
        ch = f.metadata.get("choices")
        if ch is not None and any(v not in ch for v in (value if isinstance(value, list) else [value])):
            raise SentembError(f"{where}.{key}: {value!r} is not one of {', '.join(map(repr, ch))}")
        bad = bound_error(f.metadata, value)
        if bad:
            raise SentembError(f"{where}.{key}: {value!r} {bad}")


#: the declared bounds, as (metadata key, test that fails, words for the error)
_BOUNDS = (("minimum", lambda v, b: v < b, "is below the minimum {}"),
           ("exclusive_minimum", lambda v, b: v <= b, "must be greater than {}"),
           ("maximum", lambda v, b: v > b, "is above the maximum {}"),
           ("exclusive_maximum", lambda v, b: v >= b, "must be less than {}"))


def meta_of(cls: type, name: str) -> dict:
    return next(f.metadata for f in dataclasses.fields(cls) if f.name == name)


def value_range(meta: dict) -> str | None:
    """A declared range as an interval, e.g. ``[0, 180)``, ``(0, inf)``; None without bounds."""
    lo = (f"[{meta['minimum']:g}" if meta.get("minimum") is not None
          else f"({meta['exclusive_minimum']:g}" if meta.get("exclusive_minimum") is not None else None)
    hi = (f"{meta['maximum']:g}]" if meta.get("maximum") is not None
          else f"{meta['exclusive_maximum']:g})" if meta.get("exclusive_maximum") is not None else None)
    return None if lo is None and hi is None else f"{lo or '(-inf'}, {hi or 'inf)'}"


def bound_error(meta: dict, value: Any) -> str | None:
    """Why ``value`` (a number, or each number of a list) breaks the declared bounds, or None.
    ``min_items`` of a list too; None (an optional setting left unset) is never out of range."""
    if isinstance(value, list) and meta.get("min_items") is not None and len(value) < meta["min_items"]:
        return f"needs at least {meta['min_items']} items"
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        for key, fails, words in _BOUNDS:
            if meta.get(key) is not None and fails(v, meta[key]):
                return words.format(meta[key])
    return None


@functools.lru_cache(maxsize=None)
def hints_of(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints`` of a settings class, once per class (a 700-run config builds
    thousands of them)."""
    return typing.get_type_hints(cls)


def _inner_dataclass(tp: Any) -> tuple[str, type] | None:
    """("one", D) for D or D | None, ("list", D) for list[D], ("map", D) for dict[str, D], else None."""
    if _is_union(tp):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _inner_dataclass(args[0]) if len(args) == 1 else None
    if dataclasses.is_dataclass(tp):
        return "one", tp
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list and args and dataclasses.is_dataclass(args[0]):
        return "list", args[0]
    if origin is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
        return "map", args[1]
    return None


@functools.lru_cache(maxsize=None)
def _nested(cls: type) -> tuple[tuple[dataclasses.Field, str, type], ...]:
    """(field, kind, settings class) of the fields of ``cls`` that hold settings dataclasses
    (``_inner_dataclass``), once per class."""
    hints = hints_of(cls)
    return tuple((f, *inner) for f in fields(cls) if (inner := _inner_dataclass(hints[f.name])) is not None)


def build(cls: type, values: dict | None = None):
    """An instance of settings dataclass ``cls`` from a (validated) mapping; nested settings
    dataclasses are built from their sub-mappings over the field's default instance, lists and
    mappings of settings item by item."""
    values = dict(values or {})
    for f, kind, sub in _nested(cls):
        if f.name not in values or values[f.name] is None:
            continue
        v = values[f.name]
        if kind == "one" and isinstance(v, dict):
            default = default_of(f)
            base = to_dict(default) if dataclasses.is_dataclass(default) else {}
            values[f.name] = build(sub, {**base, **v})
        elif kind == "list":
            values[f.name] = [build(sub, x) if isinstance(x, dict) else x for x in v]
        elif kind == "map":
            values[f.name] = {k: build(sub, x) if isinstance(x, dict) else x for k, x in v.items()}
    return cls(**values)


def _plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v):
        return to_dict(v)
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return copy.deepcopy(v)


def to_dict(obj) -> dict:
    """The mapping form of a settings instance (nested settings as mappings), in field order."""
    return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}


# ----------------------------------------------------------------------------------- JSON schema
_JSON = {int: "integer", float: "number", bool: "boolean", str: "string", type(None): "null", dict: "object",
         list: "array"}


def _json_type(tp: Any) -> list[str]:
    if _is_union(tp):
        return [t for a in typing.get_args(tp) for t in _json_type(a)]
    origin = typing.get_origin(tp)
    return [_JSON.get(origin or tp, "object" if dataclasses.is_dataclass(tp) else "string")]


def _value_schema(tp: Any, meta: dict, defaults: bool) -> dict:
    """The JSON schema of one value of annotation ``tp`` (a list's item, a mapping's entry, a leaf)."""
    choices = list(meta["choices"]) if meta.get("choices") else None
    inner = _inner_dataclass(tp)
    nullable = _is_union(tp) and type(None) in typing.get_args(tp)
    if inner is not None and inner[0] != "one":
        kind, sub = inner
        p = {"type": "array", "items": schema_of(sub, defaults)} if kind == "list" else \
            {"type": "object", "additionalProperties": schema_of(sub, defaults)}
    elif inner is not None:
        p = schema_of(inner[1], defaults)
    elif typing.get_origin(tp) is list or (_is_union(tp) and any(typing.get_origin(a) is list for a in typing.get_args(tp))):
        lst = tp if typing.get_origin(tp) is list else next(a for a in typing.get_args(tp) if typing.get_origin(a) is list)
        args = typing.get_args(lst)
        p = {"type": ["array", "null"] if nullable else "array"}
        p["items"] = {"enum": choices} if choices else ({"type": _json_type(args[0])[0]} if args else {})
    elif typing.get_origin(tp) is dict and len(typing.get_args(tp)) == 2 and typing.get_args(tp)[1] is not Any:
        p = {"type": "object", "additionalProperties": _value_schema(typing.get_args(tp)[1], meta, defaults)}
        return p
    elif choices:
        p = {"enum": choices}
    else:
        types = _json_type(tp)
        p = {"type": types[0] if len(types) == 1 else types}
    if nullable and inner is not None:
        p["type"] = [p.get("type", "object"), "null"]
    return p


def schema_of(cls: type, defaults: bool = True, default_instance: Any = None) -> dict:
    """The JSON-schema object of settings dataclass ``cls`` (what ``sentemb.config.load`` validates a
    config section with, and the whole config from ``sentemb.config.settings.Config``): one property per
    field with its type, allowed values, bounds, help and, with ``defaults``, its default (from
    ``default_instance`` when given, e.g. one kind of job resources). Nested settings dataclasses
    become nested objects, lists and mappings of them arrays and objects of their schema; a
    ``required`` field is listed in ``required`` and has no default."""
    hints = hints_of(cls)
    props, required = {}, []
    for f in fields(cls):
        tp, meta = hints[f.name], f.metadata
        value = getattr(default_instance, f.name) if default_instance is not None else default_of(f)
        if meta.get("schema") is not None:
            p = dict(meta["schema"]())
            if defaults and not meta.get("required"):
                p["default"] = copy.deepcopy(value)
        elif dataclasses.is_dataclass(tp):
            p = schema_of(tp, defaults, value)
            if defaults:
                p["default"] = {}
        else:
            p = _value_schema(tp, meta, defaults)
            types = p.get("type") if isinstance(p.get("type"), list) else [p.get("type")]
            bounded = p["items"] if "array" in types and isinstance(p.get("items"), dict) else p  # a list: each item
            for key, name in (("minimum", "minimum"), ("maximum", "maximum"), ("exclusive_minimum", "exclusiveMinimum"),
                              ("exclusive_maximum", "exclusiveMaximum"), ("pattern", "pattern")):
                if meta.get(key) is not None:
                    bounded[name] = meta[key]
            if meta.get("min_items") is not None:
                p["minProperties" if p.get("type") == "object" else "minItems"] = meta["min_items"]
            if meta.get("key_pattern") is not None:
                p["propertyNames"] = {"pattern": meta["key_pattern"]}
            if defaults and not meta.get("required"):
                p["default"] = _plain(value)
        if meta.get("required"):
            required.append(f.name)
        if meta.get("help"):
            p["description"] = meta["help"]
        props[f.name] = p
    out = {"type": "object", "additionalProperties": False, "properties": props}
    if required:
        out["required"] = required
    return out
