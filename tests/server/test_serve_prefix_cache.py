"""`trtbuild serve --prefix-cache`: chat turns sharing a system prompt answer exactly as LLM.chat does without
the cache, through a real server and the openai client."""

from __future__ import annotations

import openai
from live_server import metrics

MODEL = "smollm2"
SERVER_ARGS = ("--model-name", MODEL, "--prefix-cache")
SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in one short sentence, and never add a "
                                      "greeting, an apology or a follow-up question."}


def test_turns_sharing_a_system_prompt_equal_the_uncached_answers(server, smollm2_llm):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    for question in ("What is the capital of France?", "What is the capital of Spain?"):
        messages = [SYSTEM, {"role": "user", "content": question}]
        r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=24)
        expected = smollm2_llm.chat(messages, smollm2_llm.default_params(max_new_tokens=24, temperature=0))[0]
        assert r.choices[0].message.content == expected.text
    # the second turn reused the system prompt's blocks, and /metrics says so
    m = metrics(server.url)
    assert 0 < m["trtbuild_prefix_cache_hit_tokens_total"] < m["trtbuild_prefix_cache_lookup_tokens_total"]
