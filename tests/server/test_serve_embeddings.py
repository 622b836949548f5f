"""A live `trtbuild serve` of the real all-MiniLM-L6-v2 engine, through the official openai client and
TEI's /embed: vectors equal to LLM.embed (float and base64), usage, the 400 for `dimensions` and for
generation routes, concurrent requests batched into fewer engine calls. (A text-generation server refusing
embeddings: tests/server/test_serve_clients.py, on its SmolLM2 server.)"""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
from live_server import live_server, metrics

from engine_builder import LLM

MODEL = "minilm"
TEXTS = ["A man is eating food.", "A man is riding a horse on a sunny beach.", "東京は日本の首都です。", "Hi"]


@pytest.fixture(scope="module")
def server(minilm_engine):
    with live_server(minilm_engine, "--model-name", MODEL, "--threads", "2") as s:
        yield s


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def expected(minilm_engine):
    with LLM(minilm_engine) as llm:
        return llm.embed(TEXTS), [len(ids) for ids in llm.tokenizer(TEXTS).input_ids]


def test_openai_client_gets_the_llm_embed_vectors(oai, expected):
    vectors, tokens = expected
    r = oai.embeddings.create(model=MODEL, input=TEXTS)  # the client asks for base64 and decodes it
    assert [d.index for d in r.data] == [0, 1, 2, 3] and r.model == MODEL
    np.testing.assert_allclose(np.array([d.embedding for d in r.data]), vectors, atol=1e-6)
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(tokens)
    one = oai.embeddings.create(model=MODEL, input=TEXTS[1], encoding_format="float")
    np.testing.assert_allclose(one.data[0].embedding, vectors[1], atol=1e-6)
    assert one.usage.prompt_tokens == tokens[1]


def test_base64_is_little_endian_float32(server, expected):
    body = httpx.post(f"{server.url}/v1/embeddings", json={"input": TEXTS[:2], "encoding_format": "base64"},
                      timeout=60).json()
    got = np.array([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in body["data"]])
    np.testing.assert_allclose(got, expected[0][:2], atol=1e-6)
    ids = httpx.post(f"{server.url}/v1/embeddings", json={"input": [101, 7632, 102]}, timeout=60).json()  # [CLS] hi
    np.testing.assert_allclose(ids["data"][0]["embedding"], expected[0][3], atol=1e-6)


def test_what_the_server_refuses(oai, server):
    with pytest.raises(openai.BadRequestError, match="dimensions 128 is not supported.*384"):
        oai.embeddings.create(model=MODEL, input="x", dimensions=128)
    assert len(oai.embeddings.create(model=MODEL, input="x", dimensions=384).data[0].embedding) == 384
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        oai.embeddings.create(model="other", input="x")
    with pytest.raises(openai.BadRequestError, match="at most 256"):
        oai.embeddings.create(model=MODEL, input="word " * 400)
    with pytest.raises(openai.BadRequestError, match="empty"):
        oai.embeddings.create(model=MODEL, input=["fine", ""])
    for call in (lambda: oai.completions.create(model=MODEL, prompt="Hello"),
                 lambda: oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])):
        with pytest.raises(openai.BadRequestError, match="embedding model .* does not generate text"):
            call()
    r = httpx.post(f"{server.url}/generate", json={"inputs": "Hello"}, timeout=60)
    assert r.status_code == 400 and r.json()["error_type"] == "validation" and "/v1/embeddings" in r.json()["error"]


def test_tei_embed(server, expected):
    vectors = expected[0]
    one = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS[0]}, timeout=60)
    assert one.status_code == 200
    np.testing.assert_allclose(one.json(), vectors[:1], atol=1e-6)  # always a list of vectors
    many = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS, "normalize": True}, timeout=60).json()
    np.testing.assert_allclose(many, vectors, atol=1e-6)
    long = {"inputs": "word " * 400}
    too_long = httpx.post(f"{server.url}/embed", json=long, timeout=60)
    assert too_long.status_code == 422 and "truncate" in too_long.json()["error"]
    cut = httpx.post(f"{server.url}/embed", json={**long, "truncate": True}, timeout=60)
    assert cut.status_code == 200 and len(cut.json()[0]) == 384


def test_concurrent_requests_are_batched(server, expected):
    vectors = expected[0]
    before = metrics(server.url)
    with ThreadPoolExecutor(16) as pool:
        bodies = list(pool.map(lambda i: httpx.post(f"{server.url}/v1/embeddings", json={"input": TEXTS[i % 4]},
                                                    timeout=120).json(), range(32)))
    for i, body in enumerate(bodies):
        np.testing.assert_allclose(body["data"][0]["embedding"], vectors[i % 4], atol=1e-6)
    after = metrics(server.url)
    requests = after["trtbuild_embedding_requests_total"] - before["trtbuild_embedding_requests_total"]
    steps = after["trtbuild_embedding_steps_total"] - before["trtbuild_embedding_steps_total"]
    assert requests == 32 and steps < requests, (requests, steps)
