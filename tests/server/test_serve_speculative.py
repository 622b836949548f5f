"""`trtbuild serve --speculative`: a per-server setting. At temperature 0 every route's tokens equal plain
decoding's (LLM.generate without speculation), also for requests that share the batch, streamed or not,
with stop strings, logprobs and max_tokens; the acceptance rate and the drafted / accepted counts are on
/metrics; bad flags fail at start-up."""

from __future__ import annotations

import concurrent.futures

import httpx
import openai
import pytest
from cli_process import assert_user_error, trtbuild
from live_server import live_server, metrics, wait_idle

from engine_builder import LLM

MODEL = "engine"
# repetitive prompts: prompt lookup finds continuations in them, and the random model loops back into them
PROMPTS = ["w5 w6 w7 w8 w9 w5 w6 w7 w8 w9 w5 w6", "w30 w31 w32 w30 w31 w32 w30", "w100 w2 w100 w2 w100",
           "w7 w8 w7 w8 w7 w8 w7"]


@pytest.fixture(scope="module")
def plain(tiny_serve_engine):
    """What the server must answer: plain greedy decoding of the same engine, in this process."""
    return LLM(tiny_serve_engine, backend="onnxruntime")


def _expected(plain: LLM, prompt: str, max_tokens: int, **kw) -> tuple[str, str]:
    out = plain.generate([prompt], plain.default_params(max_new_tokens=max_tokens, temperature=0, **kw))[0]
    return out.text, out.finish_reason


def _served_equal_plain(server, plain: LLM, method: str) -> int:
    """Checks every route against plain decoding; how many requests ended before their max_tokens."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)

    def completion(prompt: str) -> tuple[str, str]:
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0, logprobs=1)
        c = r.choices[0]
        assert len(c.logprobs.token_logprobs) == r.usage.completion_tokens  # one logprob per token, as without
        return c.text, c.finish_reason

    def streamed(prompt: str) -> tuple[str, str]:
        text, finish = "", None
        for chunk in client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0,
                                               stream=True):
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    # concurrent: requests join one another's steps (the tiny engine decodes 2 at a time, the rest queue)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(completion, PROMPTS)) + list(pool.map(streamed, PROMPTS))
    want = [_expected(plain, p, 40) for p in PROMPTS] * 2
    assert got == want
    # stop strings and max_tokens cut where plain decoding cuts, also inside an accepted run of drafts
    full = want[0][0].split()
    stop = " ".join(full[6:8])
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=40, temperature=0, stop=[stop])
    assert (r.choices[0].text, r.choices[0].finish_reason) == _expected(plain, PROMPTS[0], 40, stop=[stop])
    finishes = [f for _, f in want] + [r.choices[0].finish_reason]
    for n in (1, 3, 7):
        r = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=n, temperature=0)
        assert r.choices[0].text == _expected(plain, PROMPTS[1], n)[0] and r.usage.completion_tokens == n
    # TGI and chat routes run the same generator
    tgi = httpx.post(f"{server.url}/generate", json={"inputs": PROMPTS[2], "parameters": {"max_new_tokens": 30}},
                     timeout=120).json()
    want_tgi = _expected(plain, PROMPTS[2], 30)
    assert tgi["generated_text"] == want_tgi[0]
    messages = [{"role": "user", "content": PROMPTS[3]}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=30, temperature=0)
    ids = plain.encode_chat(messages)
    want_chat = plain.generate(prompt_token_ids=[ids], params=plain.default_params(max_new_tokens=30,
                                                                                   temperature=0))[0].text
    assert chat.choices[0].message.content == want_chat
    finishes += [want_tgi[1], chat.choices[0].finish_reason]

    m = wait_idle(server.url)
    label = f'{{method="{method}"}}'
    drafted, accepted = m[f"trtbuild_speculative_draft_tokens_total{label}"], \
        m[f"trtbuild_speculative_accepted_tokens_total{label}"]
    assert drafted > 0 and 0 < accepted <= drafted
    assert m[f"trtbuild_speculative_acceptance_rate{label}"] == pytest.approx(accepted / drafted)
    steps = m[f"trtbuild_speculative_verify_steps_total{label}"]
    assert m[f"trtbuild_speculative_mean_accepted_length{label}"] == pytest.approx(
        m[f"trtbuild_speculative_emitted_tokens_total{label}"] / steps)
    assert m[f"trtbuild_speculative_batched_verify_steps_total{label}"] > 0  # concurrent requests verified together
    # each verify step emits its accepted drafts and the target's own token, unless the request ended first
    assert accepted < m[f"trtbuild_speculative_emitted_tokens_total{label}"] <= accepted + steps
    return finishes.count("stop")


def test_ngram_serves_plain_greedy_tokens(tiny_serve_engine, plain):
    with live_server(tiny_serve_engine, "--speculative", "ngram", "--num-draft-tokens", "4") as server:
        _served_equal_plain(server, plain, "ngram")


def test_draft_serves_plain_greedy_tokens(tiny_serve_engine, plain):
    # the engine drafting for itself: every draft the target judges matches. The only drafts not accepted are
    # those past the end of a request that stopped inside a verified run (a stop string or EOS; max_tokens
    # caps the drafts), at most k - 1 each. A fixed k keeps that bound known: with the adaptive length it
    # depends on timing (a draft run of up to 15 tokens may end in a stop string)
    k = 4
    with live_server(tiny_serve_engine, "--speculative", "draft", "--draft-engine", str(tiny_serve_engine),
                     "--num-draft-tokens", str(k)) as server:
        stopped = _served_equal_plain(server, plain, "draft")
        m = metrics(server.url)
        drafted, accepted = (m[f'trtbuild_speculative_{name}_tokens_total{{method="draft"}}']
                             for name in ("draft", "accepted"))
        assert drafted - accepted <= (k - 1) * stopped


def test_a_plain_server_has_no_speculative_metrics(tiny_server):
    assert not any(k.startswith("trtbuild_speculative") for k in metrics(tiny_server.url))


@pytest.mark.parametrize("args, needle", [
    (("--speculative", "medusa"), "not one of ngram, draft"),
    (("--speculative", "draft"), "needs --draft-engine"),
    (("--num-draft-tokens", "3"), "need --speculative"),
    (("--speculative", "ngram", "--num-draft-tokens", "0"), "positive integer"),
])
def test_bad_speculative_flags_fail_at_start(tiny_serve_engine, args, needle):
    assert_user_error(trtbuild("serve", tiny_serve_engine, "--port", "0", *args, timeout=60), needle)
