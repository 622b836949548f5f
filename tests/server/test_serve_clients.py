"""The official clients against a live `trtbuild serve` of SmolLM2 (onnxruntime): the openai package
(chat and completions, streaming and not) and huggingface_hub.InferenceClient (TGI protocol), each
checked against LLM.generate / LLM.chat on the same engine in this process: the server must add
nothing and lose nothing."""

from __future__ import annotations

import httpx
import openai
import pytest
from huggingface_hub import InferenceClient
from live_server import sse_data

MODEL = "smollm2"
SERVER_ARGS = ("--model-name", MODEL)
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def oai(server):
    # max_retries=0: a failure must show, not be retried away
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def tgi(server):
    return InferenceClient(server.url, timeout=300)


def greedy(llm, max_new_tokens, **kw):
    """What the server runs for a greedy request: the model's defaults (EOS ids) plus these."""
    return llm.default_params(max_new_tokens=max_new_tokens, temperature=0, **kw)


def test_openai_chat_answers_paris_and_equals_llm_chat(oai, smollm2_llm):
    r = oai.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=48)
    expected = smollm2_llm.chat(FRANCE, greedy(smollm2_llm, 48))[0]
    choice = r.choices[0]
    assert "Paris" in choice.message.content
    assert choice.message.content == expected.text
    assert choice.message.role == "assistant"
    assert choice.finish_reason == expected.finish_reason == "stop"
    prompt_ids = smollm2_llm.tokenizer(smollm2_llm.apply_chat_template(FRANCE), add_special_tokens=False).input_ids
    assert r.usage.prompt_tokens == len(prompt_ids)
    assert r.usage.completion_tokens == len(expected.token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.model == MODEL and r.object == "chat.completion" and r.id.startswith("chatcmpl-")


def test_openai_chat_streaming_answers_paris(oai, smollm2_llm):
    stream = oai.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=48, stream=True,
                                         stream_options={"include_usage": True})
    chunks = list(stream)
    expected = smollm2_llm.chat(FRANCE, greedy(smollm2_llm, 48))[0]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text and text == expected.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected.token_ids)
    assert len({c.id for c in chunks}) == 1


def test_openai_chat_logprobs_equal_llm(oai, smollm2_llm):
    r = oai.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=8, logprobs=True,
                                    top_logprobs=3)
    expected = smollm2_llm.chat(FRANCE, greedy(smollm2_llm, 8, logprobs=3))[0]
    content = r.choices[0].logprobs.content
    assert [c.logprob for c in content] == [lp.logprob for lp in expected.logprobs]
    assert [[t.logprob for t in c.top_logprobs] for c in content] == \
           [[v for _, v in lp.top] for lp in expected.logprobs]
    assert "".join(c.token for c in content) == smollm2_llm.tokenizer.decode(expected.token_ids)


def test_openai_completions_greedy_equals_llm_generate(oai, smollm2_llm):
    expected = smollm2_llm.generate(PROMPT, greedy(smollm2_llm, 24, logprobs=2))[0]
    r = oai.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=24, logprobs=2)
    assert r.choices[0].text == expected.text
    assert r.choices[0].finish_reason == expected.finish_reason
    assert r.choices[0].logprobs.token_logprobs == [lp.logprob for lp in expected.logprobs]
    assert r.usage.prompt_tokens == len(smollm2_llm.encode(PROMPT))
    assert r.usage.completion_tokens == len(expected.token_ids)
    streamed = oai.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=24, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected.text


def test_openai_completions_sampled_with_seed_equals_llm_generate(oai, smollm2_llm):
    params = smollm2_llm.default_params(max_new_tokens=16, temperature=0.9, top_p=0.95, seed=1234)
    expected = smollm2_llm.generate(PROMPT, params)[0]
    r = oai.completions.create(model=MODEL, prompt=PROMPT, temperature=0.9, top_p=0.95, seed=1234, max_tokens=16)
    assert r.choices[0].text == expected.text


def test_openai_models_lists_the_served_model(oai):
    models = oai.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert oai.models.retrieve(MODEL).id == MODEL


def test_tgi_text_generation_equals_llm_generate(tgi, smollm2_llm):
    expected = smollm2_llm.generate(PROMPT, greedy(smollm2_llm, 20))[0]
    assert tgi.text_generation(PROMPT, max_new_tokens=20) == expected.text
    assert "".join(tgi.text_generation(PROMPT, max_new_tokens=20, stream=True)) == expected.text


def test_tgi_details_stream_and_not(tgi, smollm2_llm):
    expected = smollm2_llm.generate(PROMPT, greedy(smollm2_llm, 20, logprobs=0))[0]
    out = tgi.text_generation(PROMPT, max_new_tokens=20, details=True)
    assert out.generated_text == expected.text
    assert [t.id for t in out.details.tokens] == list(expected.token_ids)
    assert [t.logprob for t in out.details.tokens] == [lp.logprob for lp in expected.logprobs]
    assert out.details.generated_tokens == len(expected.token_ids)
    assert out.details.finish_reason == {"length": "length", "stop": "eos_token"}[expected.finish_reason]
    assert out.details.seed is None  # greedy

    events = list(tgi.text_generation(PROMPT, max_new_tokens=20, details=True, stream=True))
    assert [e.token.id for e in events] == list(expected.token_ids)
    assert "".join(e.token.text for e in events) == expected.text
    assert all(e.generated_text is None for e in events[:-1]) and events[-1].generated_text == expected.text
    assert events[-1].details.input_length == len(smollm2_llm.encode(PROMPT))


def test_tgi_stop_sequence_and_seeded_sampling(tgi, smollm2_llm):
    out = tgi.text_generation(PROMPT, max_new_tokens=20, stop=["."], details=True)
    expected = smollm2_llm.generate(PROMPT, greedy(smollm2_llm, 20, stop=["."]))[0]
    assert out.generated_text == expected.text and "." not in out.generated_text
    assert out.details.finish_reason == "stop_sequence"

    sampled = tgi.text_generation(PROMPT, max_new_tokens=12, do_sample=True, temperature=0.8, seed=7, details=True)
    params = smollm2_llm.default_params(max_new_tokens=12, temperature=0.8, top_k=0, top_p=1.0, seed=7)
    assert sampled.generated_text == smollm2_llm.generate(PROMPT, params)[0].text
    assert sampled.details.seed == 7
    unseeded = tgi.text_generation(PROMPT, max_new_tokens=4, do_sample=True, details=True)
    assert isinstance(unseeded.details.seed, int)  # chosen by the server, reported so it can be replayed


def test_tgi_routes_by_path(server, smollm2_llm):
    """/generate and /generate_stream, as curl users call them (InferenceClient posts to /)."""
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 8}}
    expected = smollm2_llm.generate(PROMPT, greedy(smollm2_llm, 8))[0].text
    r = httpx.post(f"{server.url}/generate", json=body, timeout=300)
    assert r.status_code == 200 and r.json() == {"generated_text": expected}
    with httpx.stream("POST", f"{server.url}/generate_stream", json=body, timeout=300) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        events = list(sse_data(s.iter_lines()))
    assert "".join(e["token"]["text"] for e in events) == expected == events[-1]["generated_text"]


def test_a_generation_server_refuses_embeddings(oai, server):
    with pytest.raises(openai.BadRequestError, match="text-generation model"):
        oai.embeddings.create(model=MODEL, input="The capital of France")
    r = httpx.post(f"{server.url}/embed", json={"inputs": "The capital of France"}, timeout=60)
    assert r.status_code == 400 and "encoder engine" in r.json()["error"]
