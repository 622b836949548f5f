"""docs/reference/http.md, written from `trtbuild serve`'s own OpenAPI schema (FastAPI's, what /openapi.json serves).

Regenerate after changing a route or a request field (any decoder engine dir will do; the schema does not depend
on the model):

    .venv/bin/python tests/docs/http_reference.py build/demo/smollm2-engine

tests/docs/test_http_reference.py fails while the committed page misses a route, a request schema or a field.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "http.md"

HEADER = """# HTTP API reference

Generated from the OpenAPI schema of `trtbuild serve` (`engine_builder/server/`) by
`.venv/bin/python tests/docs/http_reference.py ENGINE_DIR`; `tests/docs/test_http_reference.py` fails when a route,
a request schema or a field of the running app is missing here. A running server serves the same schema at
`/openapi.json` and an interactive page at `/docs`. What the routes do, with examples: [serve](../guide/serve.md),
[structured output and tools](../guide/structured-output.md), [embeddings](../guide/embeddings.md); limits and
error shapes: [limits and security](../guide/limits.md).
"""


def openapi_schema(engine_dir: str | Path) -> dict:
    """The schema of the app `trtbuild serve ENGINE_DIR` runs (built in-process, nothing listens)."""
    from engine_builder import LLM
    from engine_builder.executor import Executor
    from engine_builder.server.asgi_app import create_app
    from engine_builder.server.config import ServerConfig

    llm = LLM(engine_dir, backend="onnxruntime")
    executor = Executor(llm)
    try:
        return create_app(executor, ServerConfig.for_engine(llm.engine.limits, "MODEL")).openapi()
    finally:
        executor.shutdown(drain=False)
        llm.close()


def operations(schema: dict) -> list[tuple[str, str, dict]]:
    return [(method.upper(), path, op) for path, ops in schema["paths"].items() for method, op in ops.items()]


def request_schemas(schema: dict) -> dict[str, dict]:
    """The component schemas a client sends (FastAPI's own validation-error shapes left out)."""
    return {name: s for name, s in schema.get("components", {}).get("schemas", {}).items()
            if name not in ("HTTPValidationError", "ValidationError")}


def _cell(text) -> str:
    return " ".join(str(text or "").split()).replace("|", "\\|")


def _type(prop: dict) -> str:
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in prop or "oneOf" in prop:
        return " or ".join(_type(p) for p in prop.get("anyOf", prop.get("oneOf")))
    if "enum" in prop:
        return " \\| ".join(f"`{v!r}`" if not isinstance(v, str) else f'`"{v}"`' for v in prop["enum"])
    if "const" in prop:
        return f'`"{prop["const"]}"`' if isinstance(prop["const"], str) else f"`{prop['const']!r}`"
    kind = prop.get("type", "any")
    if kind == "array":
        return f"array of {_type(prop.get('items', {}))}"
    if kind == "object" and "additionalProperties" in prop and isinstance(prop["additionalProperties"], dict):
        return f"object of {_type(prop['additionalProperties'])}"
    return kind


def _body(op: dict) -> str:
    content = op.get("requestBody", {}).get("content", {})
    return ", ".join(f"{_type(v.get('schema', {}))} ({media})" for media, v in content.items())


def render(schema: dict) -> str:
    out = [HEADER, "## Routes", "", "| route | what | request body |", "|---|---|---|"]
    for method, path, op in operations(schema):
        out.append(f"| [`{method} {path}`](#{_anchor(method, path)}) | {_cell(op.get('summary'))} | {_body(op)} |")
    out.append("")
    for method, path, op in operations(schema):
        out += [f"### {method} {path}", "", _cell(op.get("summary")), ""]
        if op.get("description"):
            out += [op["description"].strip(), ""]
        params = op.get("parameters", [])
        if params:
            out += ["Parameters: " + ", ".join(f"`{p['name']}` ({p.get('in')})" for p in params), ""]
        if _body(op):
            out += [f"Body: {_body(op)}", ""]
    out += ["## Request schemas", ""]
    for name, comp in request_schemas(schema).items():
        out += [f"### {name}", ""]
        if comp.get("description"):
            out += [_cell(comp["description"]), ""]
        props = comp.get("properties", {})
        if props:
            required = set(comp.get("required", []))
            out += ["| field | type | default | |", "|---|---|---|---|"]
            for field, prop in props.items():
                default = "required" if field in required else (f"`{json.dumps(prop['default'])}`" if "default" in prop else "")
                out.append(f"| `{field}` | {_type(prop)} | {_cell(default)} | {_cell(prop.get('description'))} |")
            out.append("")
        else:
            out += [f"Type: {_type(comp)}", ""]
    return "\n".join(out).rstrip() + "\n"


def _anchor(method: str, path: str) -> str:
    """The heading id mkdocs' toc gives `### METHOD PATH`."""
    import re

    text = f"{method} {path}".lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[-\s]+", "-", text).strip("-")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tests/docs/http_reference.py ENGINE_DIR   (a decoder engine dir, e.g. build/demo/smollm2-engine)")
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(render(openapi_schema(sys.argv[1])))
    print(f"wrote {PAGE}", file=sys.stderr)
