"""The rest of the OpenAI surface the official client sends, against a real `trtbuild serve` (SmolLM2):
echo + logprobs over the prompt (equal to the twin's own log-softmax), logit_bias, suffix refused,
unknown fields ignored, /tokenize and /detokenize."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

from engine_builder.runner.logits_processors import log_softmax

MODEL = "engine"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(smol_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{smol_server.url}/v1", api_key="none", max_retries=0, timeout=120)


def test_echo_logprobs_over_the_prompt_equal_the_twins(client, smollm2_llm):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=2, echo=True)
    lp = r.choices[0].logprobs
    ids = smollm2_llm.encode(PROMPT)
    assert r.choices[0].text.startswith(PROMPT)
    assert len(lp.tokens) == len(ids) + 1 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert "".join(lp.tokens[:len(ids)]) == PROMPT and lp.text_offset[:2] == [0, len(lp.tokens[0])]
    backend = smollm2_llm.backend  # the twin, one token per call, float32 log_softmax
    backend.kv.allocate(0, len(ids), 1)
    try:
        for i in range(len(ids) - 1):
            logits = backend.step(0, np.asarray([[ids[i]]], np.int64))
            backend.kv.advance(0, 1)
            expected = log_softmax(np.array(logits))[0]
            assert abs(lp.token_logprobs[i + 1] - float(expected[ids[i + 1]])) < 1e-4
            assert len(lp.top_logprobs[i + 1]) == 2
            assert abs(max(lp.top_logprobs[i + 1].values()) - float(expected.max())) < 1e-4
    finally:
        backend.release(0)


def test_logit_bias_forces_and_bans_tokens(client, smollm2_llm):
    forced = smollm2_llm.encode(" banana")[0]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0,
                                  logit_bias={str(forced): 100})
    assert r.choices[0].text == " banana" * 3
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0)
    first = smollm2_llm.encode(plain.choices[0].text)[0]
    banned = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0,
                                       logit_bias={str(first): -100})
    assert banned.choices[0].text != plain.choices[0].text
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, logit_bias={"5": 500})


def test_suffix_refused_unknown_fields_ignored(client):
    with pytest.raises(openai.BadRequestError, match="suffix"):
        client.completions.create(model=MODEL, prompt=PROMPT, suffix="!", max_tokens=2)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                       extra_body={"some_future_option": {"x": 1}}, user="u-1",
                                       stream_options=None)
    assert r.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                       temperature="hot")


def test_tokenize_and_detokenize(smol_server, smollm2_llm):
    r = httpx.post(f"{smol_server.url}/tokenize", json={"prompt": PROMPT}, timeout=30).json()
    assert r["tokens"] == smollm2_llm.encode(PROMPT) and r["count"] == len(r["tokens"]) and r["max_model_len"]
    chat = {"messages": [{"role": "user", "content": "Hi"}]}
    plain = httpx.post(f"{smol_server.url}/tokenize", json=chat, timeout=30).json()
    assert plain["tokens"] == smollm2_llm.encode_chat(chat["messages"])
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with_tools = httpx.post(f"{smol_server.url}/tokenize", json={**chat, "tools": tools}, timeout=30).json()
    assert with_tools["count"] > plain["count"]  # the tool definitions are part of the prompt
    text = httpx.post(f"{smol_server.url}/detokenize", json={"tokens": r["tokens"]}, timeout=30).json()["prompt"]
    assert text == PROMPT
    bad = httpx.post(f"{smol_server.url}/detokenize", json={"tokens": [-1]}, timeout=30)
    assert bad.status_code == 422 and "tokens" in bad.json()["error"]


def test_n_choices_seeded_and_usage(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=1.0, seed=7, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == 18 and r.usage.total_tokens == r.usage.prompt_tokens + 18
    alone = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=1.0, seed=8)
    assert alone.choices[0].text == r.choices[1].text  # choice i is seed + i
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                       temperature=1.0, seed=1, n=2)
    assert len(c.choices) == 2 and c.usage.completion_tokens == 6
