"""`trtbuild serve-triton` on the tiny engine, one real Triton (the nvidia-pytriton wheel's tritonserver) for the
module, driven by the official tritonclient over HTTP and gRPC: tokens identical to LLM.generate's."""

from __future__ import annotations

import httpx
import pytest
import tritonclient.http as httpclient
from triton_processes import TritonProcess, grpc_stream, http_infer
from tritonclient.utils import InferenceServerException

from engine_builder.runner.llm import LLM
from engine_builder.runner.sampling_params import SamplingParams

PROMPTS = ["w5 w6 w7", "w11 w12 w13 w14 w15"]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def expected(tiny_serve_engine):
    """What `trtbuild run` / LLM.generate give: greedy, and sampled with a seed."""
    llm = LLM(tiny_serve_engine)
    greedy = {p: llm.generate(p, SamplingParams(max_new_tokens=MAX_TOKENS))[0] for p in PROMPTS}
    seeded = llm.generate(PROMPTS[0], SamplingParams(max_new_tokens=MAX_TOKENS, temperature=1.0, seed=7))[0]
    return greedy, seeded


@pytest.fixture(scope="module")
def triton(tiny_serve_engine):
    server = TritonProcess(tiny_serve_engine, "--model-name", "tiny")
    yield server
    assert server.stop() == 0, server.log()[-4000:]


def test_grpc_streams_token_by_token(triton, expected):
    assert triton.first_stdout_line, "stdout holds the ready line only (Triton's log goes to stderr)"
    greedy, _ = expected
    streamed = grpc_stream(triton.grpc_url, triton.model, PROMPTS, MAX_TOKENS)  # both in flight together
    for prompt, got in zip(PROMPTS, streamed):
        want = greedy[prompt]
        assert got.error is None, got.error
        assert len(want.token_ids) == MAX_TOKENS
        assert got.ids == [[t] for t in want.token_ids]  # one response per token
        assert "".join(got.texts) == want.text


def test_grpc_seeded_sampling_is_the_engines(triton, expected):
    _, seeded = expected
    (got,) = grpc_stream(triton.grpc_url, triton.model, PROMPTS[:1], MAX_TOKENS, temperature=1.0, seed=7)
    assert [t for ids in got.ids for t in ids] == list(seeded.token_ids)


def test_http_infer_and_generate(triton, expected):
    greedy, _ = expected
    want = greedy[PROMPTS[1]]
    # Triton's HTTP /infer refuses decoupled models, so the engine is also served as <name>_sync
    text, ids = http_infer(triton.http_url, f"{triton.model}_sync", PROMPTS[1], MAX_TOKENS)
    assert (text, ids) == (want.text, list(want.token_ids))
    client = httpclient.InferenceServerClient(triton.http_url.removeprefix("http://"))
    with pytest.raises(InferenceServerException, match="decoupled"):
        client.infer(triton.model, [])
    assert client.get_model_config(triton.model)["model_transaction_policy"]["decoupled"] is True
    client.close()
    # Triton's generate extension serves the decoupled model over HTTP, whole or as server-sent events
    r = httpx.post(f"{triton.http_url}/v2/models/{triton.model}/generate",
                   json={"text_input": PROMPTS[1], "max_tokens": MAX_TOKENS}, timeout=120)
    assert r.status_code == 200, r.text
    assert (r.json()["text_output"], r.json()["output_ids"]) == (want.text, list(want.token_ids))


def test_bad_requests_are_client_errors(triton):
    r = httpx.post(f"{triton.http_url}/v2/models/{triton.model}/generate",
                   json={"text_input": PROMPTS[0], "max_tokens": 0}, timeout=60)
    assert r.status_code == 400 and "max_tokens must be at least 1" in r.text, r.text
    (got,) = grpc_stream(triton.grpc_url, triton.model, ["w1 " * 200], MAX_TOKENS)  # over max_input_len 32
    assert got.error is not None and got.ids == [], got
    # the server still serves
    (ok,) = grpc_stream(triton.grpc_url, triton.model, PROMPTS[:1], 2)
    assert ok.error is None and len(ok.ids) == 2
