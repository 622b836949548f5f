"""Several sequences for one prompt on a live server (the tiny engine): OpenAI's n streamed, its chunks
interleaved and tagged with their choice's index (each choice equal to its non-streamed twin), and TGI's
best_of (the likeliest of best_of sampled sequences, the others in details.best_of_sequences)."""

from __future__ import annotations

import httpx
import openai
import pytest
from huggingface_hub import InferenceClient
from live_server import sse_data

MODEL = "engine"
MESSAGES = [{"role": "user", "content": "w5 w6 w7"}]


@pytest.fixture(scope="module")
def oai(tiny_server):
    return openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_streamed_chat_choices_interleave_and_equal_the_unstreamed_ones(oai):
    # n 2: the tiny engine's max_batch, so both choices decode in the same steps
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=1.0, seed=11, n=2)
    whole = oai.chat.completions.create(**kw)
    texts, finished, order = {0: "", 1: ""}, {}, []
    usage = None
    for chunk in oai.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            assert len(chunk.choices) == 1  # one choice per chunk, as OpenAI streams n > 1
            assert c.index not in finished, "a chunk after its choice's finish_reason"
            order.append(c.index)
            texts[c.index] += c.delta.content or ""
            if c.finish_reason is not None:
                finished[c.index] = c.finish_reason
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert finished == {c.index: c.finish_reason for c in whole.choices}
    assert len(set(texts.values())) > 1  # seed + i: the choices differ
    # the choices decode in one batch: their tokens come interleaved, not one choice after another
    first_of_each = [order.index(i) for i in range(2)]
    last_of_each = [len(order) - 1 - order[::-1].index(i) for i in range(2)]
    assert min(last_of_each) > max(first_of_each), order
    assert usage.completion_tokens == whole.usage.completion_tokens and usage.prompt_tokens == whole.usage.prompt_tokens


def test_streamed_completion_choices(tiny_server, oai):
    kw = dict(model=MODEL, prompt="w1 w2 w3", max_tokens=6, temperature=1.0, seed=3, n=2, logprobs=1)
    whole = oai.completions.create(**kw)
    texts = {0: "", 1: ""}
    logprobs = {0: [], 1: []}
    for chunk in oai.completions.create(**kw, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.text
            logprobs[c.index] += c.logprobs.token_logprobs if c.logprobs else []
    assert texts == {c.index: c.text for c in whole.choices}
    for c in whole.choices:
        assert logprobs[c.index] == pytest.approx(c.logprobs.token_logprobs, abs=1e-6)
    # the raw stream: every data line but [DONE] is one chunk of one choice
    with httpx.stream("POST", f"{tiny_server.url}/v1/completions", json={**kw, "stream": True}, timeout=60) as s:
        events = list(sse_data(s.iter_lines()))
    assert events[-1] == "[DONE]"
    assert sorted({e["choices"][0]["index"] for e in events[:-1]}) == [0, 1]


def test_tgi_best_of_answers_the_likeliest_sequence(tiny_server):
    tgi = InferenceClient(tiny_server.url, timeout=120)
    out = tgi.text_generation("w1 w2 w3", max_new_tokens=6, do_sample=True, temperature=1.5, best_of=3,
                              details=True)
    others = out.details.best_of_sequences
    assert len(others) == 2
    best = sum(t.logprob for t in out.details.tokens)
    sums = [sum(t.logprob for t in o.tokens) for o in others]
    assert all(best >= s for s in sums) and sums == sorted(sums, reverse=True)
    # each sequence is its own seeded request: replayed alone with its seed, it is the same text
    for seq in [out.details, *others]:
        text = out.generated_text if seq is out.details else seq.generated_text
        again = tgi.text_generation("w1 w2 w3", max_new_tokens=6, do_sample=True, temperature=1.5, seed=seq.seed)
        assert again == text
    assert len({out.details.seed, *(o.seed for o in others)}) == 3


@pytest.mark.parametrize("parameters, needle", [
    ({"best_of": 2}, "needs sampling"),
    ({"best_of": 2, "do_sample": True, "seed": 1}, "seed must not be set"),
    ({"best_of": 17, "do_sample": True}, "at most 16"),
    ({"best_of": 0, "do_sample": True}, "best_of"),
])
def test_tgi_best_of_refusals(tiny_server, parameters, needle):
    r = httpx.post(f"{tiny_server.url}/generate", json={"inputs": "w1", "parameters": parameters}, timeout=60)
    assert r.status_code == 422 and r.json()["error_type"] == "validation" and needle in r.json()["error"], r.text
    r = httpx.post(f"{tiny_server.url}/generate_stream", json={"inputs": "w1", "parameters": {
        "best_of": 2, "do_sample": True}}, timeout=60)
    assert r.status_code == 422 and "streaming" in r.json()["error"]
