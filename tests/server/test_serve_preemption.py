"""`trtbuild serve --kv-budget-tokens`: an urgent chat request (OpenAI `priority`) preempts a long one that holds the
whole KV budget; the long one resumes by recompute, and both answers equal the requests run alone (SmolLM2,
greedy), through a real server and the openai client. /metrics counts the preemption."""

from __future__ import annotations

import openai
from live_server import metrics, wait_idle

MODEL = "smollm2"
SERVER_ARGS = ("--model-name", MODEL, "--kv-budget-tokens", "256")  # 16 blocks: one long request fills them
LONG = [{"role": "user", "content": "Count from 1 to 300, separated by commas."}]
URGENT = [{"role": "user", "content": "What is the capital of France?"}]


def test_an_urgent_request_preempts_and_both_answers_stay_exact(server, smollm2_llm):
    def alone(messages, n):
        return smollm2_llm.chat(messages, smollm2_llm.default_params(max_new_tokens=n, temperature=0))[0]

    long_tokens = 256 - len(smollm2_llm.encode_chat(LONG))  # all 16 blocks
    want_long, want_urgent = alone(LONG, long_tokens), alone(URGENT, 12)
    assert len(want_long.token_ids) > 40  # still decoding long after the urgent request arrives
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=600)
    before = metrics(server.url)["trtbuild_preemptions_total"]
    stream = client.chat.completions.create(model=MODEL, messages=LONG, temperature=0, max_tokens=long_tokens,
                                            stream=True, extra_body={"priority": 5})
    chunks = iter(stream)
    parts = [next(chunks).choices[0].delta.content or "" for _ in range(3)]  # decoding now
    r = client.chat.completions.create(model=MODEL, messages=URGENT, temperature=0, max_tokens=12,
                                       extra_body={"priority": -1})
    parts += [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert r.choices[0].message.content == want_urgent.text
    assert "".join(parts) == want_long.text  # resumed where it stopped: nothing repeated, nothing different
    m = wait_idle(server.url)
    assert m["trtbuild_preemptions_total"] - before == 1
    assert m["trtbuild_kv_blocks_used"] == 0
