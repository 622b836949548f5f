"""`trtbuild serve --backend torch` (the PyTorch backend; float32 with the reference attention on a CPU): the
openai client and TGI's route get the answers the onnxruntime twin gives in this process, streamed or not, alone
or several at once through the executor's in-flight batching."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

MODEL = "smollm2"
SERVER_ARGS = ("--model-name", MODEL, "--backend", "torch")
QUESTIONS = ["What is the capital of France?", "What is the capital of Italy?", "Name a primary color.",
             "What is 2 + 2?"]


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def chat(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def test_openai_chat_equals_the_twin_streamed_or_not(oai, smollm2_llm):
    r = oai.chat.completions.create(model=MODEL, messages=chat(QUESTIONS[0]), temperature=0, max_tokens=24)
    twin = smollm2_llm.chat(chat(QUESTIONS[0]), smollm2_llm.default_params(max_new_tokens=24, temperature=0))[0]
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].message.content == twin.text and r.usage.completion_tokens == len(twin.token_ids)
    stream = oai.chat.completions.create(model=MODEL, messages=chat(QUESTIONS[0]), temperature=0, max_tokens=24,
                                         stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == twin.text


def test_concurrent_requests_each_get_their_solo_answer(oai, smollm2_llm):
    def ask(question: str) -> str:
        r = oai.chat.completions.create(model=MODEL, messages=chat(question), temperature=0, max_tokens=16)
        return r.choices[0].message.content

    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        together = list(pool.map(ask, QUESTIONS))
    params = smollm2_llm.default_params(max_new_tokens=16, temperature=0)
    assert together == [smollm2_llm.chat(chat(q), params)[0].text for q in QUESTIONS]


def test_tgi_generate_route(server, smollm2_llm):
    prompt = "The capital of France is"
    r = httpx.post(f"{server.url}/generate", json={"inputs": prompt, "parameters": {"max_new_tokens": 8}},
                   timeout=300)
    assert r.status_code == 200
    twin = smollm2_llm.generate(prompt, smollm2_llm.default_params(max_new_tokens=8, temperature=0))[0]
    assert r.json()["generated_text"] == twin.text
