"""Plain data (JSON, YAML) -> frozen dataclasses, rejecting unknown keys.

`from_dict` lists the valid keys on an unknown one, so a typo in a recipe or a config from a
newer schema fails loudly instead of being ignored.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from engine_builder.util.errors import ConfigError


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass `cls` from plain data, recursing into nested dataclasses.

    Unknown keys raise ConfigError naming the valid keys.
    """
    where = where or cls.__name__
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(fields)}")
    hints = typing.get_type_hints(cls)
    return cls(**{k: _coerce(hints[k], v, f"{where}.{k}") for k, v in data.items()})


def _coerce(hint: Any, value: Any, where: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _coerce(inner[0], value, where)
    if origin is tuple and isinstance(value, list | tuple):
        args = typing.get_args(hint)
        return tuple(_coerce(args[0], v, where) for v in value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value
