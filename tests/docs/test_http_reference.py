"""The HTTP API reference cannot drift from the server: every route, request schema and request field of the app
`trtbuild serve` runs appears in docs/reference/http.md. The app is built in-process on the tiny engine the server
tests share (no socket)."""

from __future__ import annotations

import re

from http_reference import PAGE, openapi_schema, operations, request_schemas

FIX = "regenerate it: .venv/bin/python tests/docs/http_reference.py ENGINE_DIR (any decoder engine dir)"


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^### ", text, flags=re.M)
    return {part.split("\n", 1)[0].strip(): part for part in parts[1:]}


def test_every_route_schema_and_field_is_documented(tiny_serve_engine):
    schema = openapi_schema(tiny_serve_engine)
    sections = _sections(PAGE.read_text())
    missing = [f"route {method} {path}" for method, path, _ in operations(schema) if f"{method} {path}" not in sections]
    for name, component in request_schemas(schema).items():
        section = sections.get(name)
        if section is None:
            missing.append(f"schema {name}")
            continue
        missing += [f"{name}.{field}" for field in component.get("properties", {}) if f"| `{field}` |" not in section]
    assert len(operations(schema)) >= 10, "the app has fewer routes than the page was written for: check the fixture"
    assert not missing, f"{PAGE.name} misses {', '.join(missing)}; {FIX}"
