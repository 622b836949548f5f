"""The embedding routes' OpenAPI schema under schemathesis, on the app over a real EmbeddingBatcher and the
MiniLM engine: whatever is sent, valid or not, the answer is never a 5xx and never carries a traceback."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from engine_builder import Embeddings
from engine_builder.executor.embedding_batcher import EmbeddingBatcher
from engine_builder.server.config import ServerConfig
from engine_builder.server.embedding_app import create_embedding_app
from engine_builder.server.embeddings_api import EmbeddingService

EXAMPLES = 40  # per route and mode


@pytest.fixture(scope="module")
def schema(minilm_engine):
    with Embeddings(minilm_engine) as model:
        batcher = EmbeddingBatcher(model.embedder)
        config = ServerConfig(model_name="minilm", max_input_tokens=256, max_total_tokens=256)
        try:
            app = create_embedding_app(EmbeddingService(batcher, config))
            yield schemathesis.openapi.from_asgi("/openapi.json", app)
        finally:
            batcher.shutdown(drain=False)


CASES = [(route, mode) for route in ("POST /v1/embeddings", "POST /embed")
         for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]


@pytest.mark.parametrize("route, mode", CASES, ids=[f"{r}-{m.value}" for r, m in CASES])
def test_never_a_5xx(schema, route, mode):
    operation = {f"{op.method.upper()} {op.path}": op for op in (r.ok() for r in schema.get_all_operations())}[route]

    @given(case=operation.as_strategy(mode))
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
              database=None)
    def check(case):
        response = case.call()
        assert response.status_code < 500, f"{route} {case.body!r}: {response.status_code} {response.text[:300]}"
        assert "Traceback" not in response.text

    check()
