"""The app in-process over a real Executor (no uvicorn): states a live server cannot easily reach."""

from __future__ import annotations

from fastapi.testclient import TestClient

from engine_builder.executor import Executor
from engine_builder.server.asgi_app import create_app
from engine_builder.server.config import ServerConfig


def test_health_is_503_once_the_executor_has_stopped(smollm2_llm):
    executor = Executor(smollm2_llm)
    try:
        app = create_app(executor, ServerConfig.for_engine(smollm2_llm.engine.limits, "smollm2"))
        with TestClient(app) as client:
            assert client.get("/health").json() == {"status": "ok", "model": "smollm2"}
            executor.shutdown()
            r = client.get("/health")
            assert r.status_code == 503 and r.json()["error_type"] == "unhealthy"
            # a request after the stop is refused at once (503, the executor's reason), never left hanging
            r = client.post("/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 2}})
            assert r.status_code == 503 and "shut down" in r.json()["error"] and "restart" in r.json()["error"]
    finally:
        executor.shutdown()
