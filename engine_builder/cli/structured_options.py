"""`trtbuild run --json-schema FILE / --regex / --choice`: the SamplingParams constraint fields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine_builder.util.errors import InputError


def constraint_options(json_schema: Path | None, regex: str | None, choice: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if json_schema is not None:
        try:
            out["json_schema"] = json.loads(Path(json_schema).read_text())
        except OSError as exc:
            raise InputError(f"cannot read --json-schema {json_schema}: {exc.strerror}; give a JSON schema file") \
                from None
        except json.JSONDecodeError as exc:
            raise InputError(f"--json-schema {json_schema} is not valid JSON ({exc}); give a JSON schema file") \
                from None
    if regex is not None:
        out["regex"] = regex
    if choice:
        out["choice"] = tuple(choice)
    return out
