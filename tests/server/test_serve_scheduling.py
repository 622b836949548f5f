"""`trtbuild serve` scheduling through a real server and the openai client: /metrics reports the KV budget and the
prefix cache's hit rate on a chat's second turn (the previous turn's KV reused), and every answer equals the same
request run alone on an LLM without a prefix cache (preemption: test_serve_preemption.py)."""

from __future__ import annotations

import openai
import pytest
from live_server import metrics, wait_idle

from engine_builder import LLM

MODEL = "tiny"
# one request of up to 96 tokens at a time: a second one preempts or waits
# --parse-chat-special-tokens: the tiny vocabulary's special tokens are word-like (w0, w1, w2), so an answer such as
# "w282" fed back as the assistant turn holds special-token text, which the server otherwise tokenizes as text;
# parsed, the conversation tokenizes as LLM.chat does, and the answers compare token for token with `alone`
SERVER_ARGS = ("--model-name", MODEL, "--kv-budget-tokens", "96", "--max-num-batched-tokens", "16",
               "--parse-chat-special-tokens")
SYSTEM = " ".join(f"w{i}" for i in range(30, 42))  # (w0, w1, w2 are special: no word may start so)


@pytest.fixture(scope="module")
def alone(tiny_serve_engine):
    llm = LLM(tiny_serve_engine, prefix_cache=False)
    yield lambda messages, n: llm.chat(messages, llm.default_params(max_new_tokens=n, temperature=0))[0]
    llm.close()


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_metrics_report_the_budget_and_a_chat_turn_reusing_the_last(tiny_server, alone):
    m = metrics(tiny_server.url)
    assert (m["trtbuild_kv_blocks_total"], m["trtbuild_kv_blocks_used"], m["trtbuild_kv_tokens_free"]) == (6, 0, 96)
    client = _client(tiny_server)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "w60 w61 w62 w63"}]
    before = metrics(tiny_server.url)["trtbuild_prefix_cache_hit_tokens_total"]
    for ask in ("w70 w71 w72", None):
        r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=3)
        assert r.choices[0].message.content == alone(messages, 3).text
        if ask:
            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": ask}]
    m = wait_idle(tiny_server.url)
    # the second turn copied the first 16-token block (system prompt, first question) instead of prefilling it
    assert m["trtbuild_prefix_cache_hit_tokens_total"] - before >= 16
    assert 0 < m["trtbuild_prefix_cache_hit_rate"] < 1
    assert m["trtbuild_kv_blocks_used"] == 0 and m["trtbuild_prefix_cache_blocks"] >= 1


def test_priority_must_be_an_integer(tiny_server):
    with pytest.raises(openai.BadRequestError, match="priority"):  # OpenAI routes answer 400 naming the field
        _client(tiny_server).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "w5"}],
                                                     max_tokens=2, extra_body={"priority": "high"})
