"""`trtbuild serve --kv-budget-tokens`: an urgent chat request (OpenAI `priority`) preempts a long one that holds
nearly all the KV budget (admission is optimistic: the long one holds the blocks of what it has written so far,
so the urgent one arrives once those leave it too little); the long one resumes by recompute, and both answers
equal the requests run alone (SmolLM2, greedy), through a real server and the openai client. /metrics counts
the preemption."""

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

    long_prompt = len(smollm2_llm.encode_chat(LONG))
    long_tokens = 256 - long_prompt  # all 16 blocks at its end
    # the urgent one needs its prompt's blocks (+ its first token) and the 1-block watermark: it is preempted
    # in once the long one holds more than the rest (its context so far + the next token, in blocks)
    urgent_blocks = -(-(len(smollm2_llm.encode_chat(URGENT)) + 1) // 16)
    streamed_before_urgent = 16 * (16 - 1 - urgent_blocks) - long_prompt + 2  # + a role-only chunk, + 1
    want_long, want_urgent = alone(LONG, long_tokens), alone(URGENT, 12)
    assert len(want_long.token_ids) > streamed_before_urgent + 20  # still decoding long after the urgent arrives
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=600)
    before = metrics(server.url)["trtbuild_preemptions_total"]
    stream = client.chat.completions.create(model=MODEL, messages=LONG, temperature=0, max_tokens=long_tokens,
                                            stream=True, extra_body={"priority": 5})
    chunks = iter(stream)
    parts = [next(chunks).choices[0].delta.content or "" for _ in range(streamed_before_urgent)]
    r = client.chat.completions.create(model=MODEL, messages=URGENT, temperature=0, max_tokens=12,
                                       extra_body={"priority": -1})
    parts += [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert r.choices[0].message.content == want_urgent.text
    assert "".join(parts) == want_long.text  # resumed where it stopped: nothing repeated, nothing different
    m = wait_idle(server.url)
    assert m["trtbuild_preemptions_total"] - before == 1
    assert m["trtbuild_kv_blocks_used"] == 0
