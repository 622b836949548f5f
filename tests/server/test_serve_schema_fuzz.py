"""A standing property test over the server's own OpenAPI schema (TGI and OpenAI routes), on the app
over a real Executor on the tiny engine: whatever schemathesis sends, valid or not, the answer is
never a 5xx and always comes within HANG_S. Positive (schema-valid) and negative (schema-violating)
examples; bounded, so the file runs in well under a minute."""

from __future__ import annotations

import time

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from engine_builder import LLM
from engine_builder.executor import Executor
from engine_builder.server.asgi_app import create_app
from engine_builder.server.config import ServerConfig

EXAMPLES = 80  # per route and mode
HANG_S = 20.0  # longer than any tiny-engine request (96 tokens), far shorter than a hang


@pytest.fixture(scope="module")
def schema(tiny_serve_engine):
    llm = LLM(tiny_serve_engine, backend="onnxruntime")
    executor = Executor(llm)
    config = ServerConfig.for_engine(llm.engine.limits, "tiny", request_timeout=HANG_S / 2)
    try:
        yield schemathesis.openapi.from_asgi("/openapi.json", create_app(executor, config))
    finally:
        executor.shutdown(drain=False)
        llm.close()


# schemathesis's own pytest plugin (from_fixture) does not run under pytest 9: one hypothesis test per route
def _operations(schema):
    return {f"{op.method.upper()} {op.path}": op for op in (r.ok() for r in schema.get_all_operations())}


POSTS = ["POST /generate", "POST /generate_stream", "POST /", "POST /v1/completions", "POST /v1/chat/completions"]
GETS = ["GET /v1/models", "GET /v1/models/{model}", "GET /health", "GET /metrics"]
# negative examples need a body to break (a GET has nothing schemathesis can make invalid)
CASES = [(route, GenerationMode.POSITIVE) for route in POSTS + GETS] + \
        [(route, GenerationMode.NEGATIVE) for route in POSTS]


@pytest.mark.parametrize("route, mode", CASES, ids=[f"{r}-{m.value}" for r, m in CASES])
def test_never_a_5xx_never_a_hang(schema, route, mode):
    operation = _operations(schema)[route]

    @given(case=operation.as_strategy(mode))
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
              database=None)
    def check(case):
        started = time.monotonic()
        response = case.call()
        elapsed = time.monotonic() - started
        assert response.status_code < 500, f"{route} {case.body!r}: {response.status_code} {response.text[:300]}"
        assert "Traceback" not in response.text
        assert elapsed < HANG_S, f"{route} {case.body!r} took {elapsed:.1f} s"

    check()
