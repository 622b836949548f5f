"""A repository from `trtbuild export-triton`, loaded by real tritonserver (the nvidia-pytriton wheel's) with
its python backend: the model.py runs the engine in Triton's stub process, and tritonclient's gRPC stream and
Triton's HTTP generate endpoint get the engine's greedy tokens."""

from __future__ import annotations

import httpx
import pytest
from cli_process import trtbuild
from triton_processes import free_ports, grpc_stream

from engine_builder.runner.llm import LLM
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.triton_serving import stub_env
from engine_builder.triton_serving.pytriton_binding import repository_server

PROMPT = "w9 w8 w7 w6"
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def repository(tiny_serve_engine, module_tmp_factory):
    repo = module_tmp_factory.mktemp("triton") / "repo"
    # the stub's numpy 1.x env (stub_env.py); on a Triton install of its own, leave --python-env out
    r = trtbuild("export-triton", tiny_serve_engine, repo, "--model-name", "tiny",
                 "--python-env", stub_env.require(), timeout=120)
    assert r.returncode == 0, r.stderr
    http, grpc, metrics = free_ports(3)
    with repository_server(repo, http_port=http, grpc_port=grpc, metrics_port=metrics) as url:
        yield url, f"127.0.0.1:{grpc}"


def test_exported_model_streams_the_engines_tokens(repository, tiny_serve_engine):
    http_url, grpc_url = repository
    want = LLM(tiny_serve_engine).generate(PROMPT, SamplingParams(max_new_tokens=MAX_TOKENS))[0]
    assert len(want.token_ids) == MAX_TOKENS
    (got,) = grpc_stream(grpc_url, "tiny", [PROMPT], MAX_TOKENS)
    assert got.error is None, got.error
    assert got.ids == [[t] for t in want.token_ids] and "".join(got.texts) == want.text
    r = httpx.post(f"{http_url}/v2/models/tiny/generate", json={"text_input": PROMPT, "max_tokens": MAX_TOKENS},
                   timeout=120)
    assert r.status_code == 200, r.text
    assert (r.json()["text_output"], r.json()["output_ids"]) == (want.text, list(want.token_ids))
    # a bad request is the client's: 400 with the one-line reason, and the model keeps serving
    r = httpx.post(f"{http_url}/v2/models/tiny/generate", json={"text_input": PROMPT, "max_tokens": 0}, timeout=60)
    assert r.status_code == 400 and r.json() == {"error": "max_tokens must be at least 1, got 0"}, r.text
    (again,) = grpc_stream(grpc_url, "tiny", [PROMPT], 3)
    assert again.ids == [[t] for t in want.token_ids[:3]]
