"""Plain data (JSON, YAML) -> frozen dataclasses, rejecting unknown keys and wrong types.

`from_dict` lists the valid keys on an unknown one, so a typo in a recipe or a config from a
newer schema fails loudly instead of being ignored; a value of the wrong type (a string where an
int goes, a bool where a float goes, a name outside a Literal) fails with the key's dotted path:
`recipe r.yaml: build.limits.max_seq_len: expected int, got str`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
import types
import typing
from typing import Any, Literal

from engine_builder.util.errors import ConfigError


class _FieldError(Exception):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass `cls` from plain data, recursing into nested dataclasses.

    Unknown keys raise ConfigError naming the valid keys; missing required keys and values of the
    wrong type raise ConfigError naming the key's dotted path. An int is taken for a float, a list
    for a tuple; nothing else is converted."""
    where = where or cls.__name__
    try:
        return _from_dict(cls, data, "")
    except _FieldError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def check_types(obj: Any, where: str) -> None:
    """The checks `from_dict` makes, on a dataclass built in code (a converter's ModelConfig from an HF
    config.json): a value of the wrong type raises ConfigError naming its dotted path."""
    try:
        _check_instance(obj, "")
    except _FieldError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _check_instance(obj: Any, path: str) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, where = getattr(obj, f.name), f"{path}.{f.name}" if path else f.name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _check_instance(value, where)
        else:
            _coerce(hints[f.name], value, where)


def _from_dict(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise _FieldError(path, f"expected a mapping, got {_kind(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    odd = [k for k in data if not isinstance(k, str)]
    if odd:
        raise _FieldError(path, f"key {odd[0]!r} is not a string; valid keys: {', '.join(fields)}")
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise _FieldError(path, f"unknown key(s) {', '.join(map(_shown, unknown))}; valid keys: {', '.join(fields)}")
    missing = [name for name, f in fields.items() if name not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise _FieldError(path, f"missing key(s) {', '.join(missing)}")
    hints = typing.get_type_hints(cls)
    return cls(**{k: _coerce(hints[k], v, f"{path}.{k}" if path else k) for k, v in data.items()})


def _coerce(hint: Any, value: Any, path: str) -> Any:
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        return _from_dict(hint, value, path)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and value is not None:  # `X | None`: X's own message (a nested key's path)
            return _coerce(inner[0], value, path)
        for arg in inner:
            with contextlib.suppress(_FieldError):
                return _coerce(arg, value, path)
        raise _FieldError(path, f"expected {_name(hint)}, got {_kind(value)}")
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        raise _FieldError(path, f"expected one of {', '.join(map(repr, args))}, got {value!r}")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise _FieldError(path, f"expected a list, got {_kind(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise _FieldError(path, f"expected a list of {len(args)}, got {len(value)} items")
        return tuple(_coerce(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin is list:
        if not isinstance(value, list | tuple):
            raise _FieldError(path, f"expected a list, got {_kind(value)}")
        return [_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)] if args else list(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise _FieldError(path, f"expected a mapping, got {_kind(value)}")
        if not args:
            return dict(value)
        return {_coerce(args[0], k, f"{path} key"): _coerce(args[1], v, f"{path}.{k}") for k, v in value.items()}
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:  # numbers.*: a numpy scalar from a GGUF reader counts too
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    else:
        return value  # a type this reader does not check
    raise _FieldError(path, f"expected {_name(hint)}, got {_kind(value)}")


def _name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _name(a) for a in typing.get_args(hint))
    if typing.get_origin(hint) is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(hint)))
    if typing.get_origin(hint) in (tuple, list):
        return "a list"
    if typing.get_origin(hint) is dict or dataclasses.is_dataclass(hint):
        return "a mapping"
    return getattr(hint, "__name__", str(hint))


def _kind(value: Any) -> str:
    """The YAML / JSON word for VALUE's type."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _shown(key: str) -> str:
    """A key as the user wrote it, unless it holds what would break the one-line error (a newline, a control)."""
    return key if key.isprintable() else repr(key)
