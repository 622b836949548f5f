"""The grammar compiler's bounds (issue 36): size and branch limits checked before any compile, a compile
time budget, a cache bounded by count and bytes, and an answer llguidance gave up on mid-way reported as
an error (never a "stop" whose text fails its schema): the compiler with real llguidance over SmolLM2's
tokenizer, and a real `trtbuild serve` through the openai client."""

from __future__ import annotations

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from engine_builder.runner.grammar import GrammarCompiler, GrammarLimits
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.server.tool_calls import MAX_TOOLS
from engine_builder.util.errors import InputError

MODEL = "engine"
# llguidance gives up after `{"` (a parser row of 2,200 items, its limit is 2,000): each branch allows extra
# keys, so every branch adds ~11 items; within the grammar limits (200 branches, 12 KB). `{}` is valid too: the
# server tests bias the `{"` token so that the model takes a key
GIVES_UP = {"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}} for i in range(200)]}


def _schema(i: int) -> dict:
    return {"type": "object", "properties": {f"key{i}": {"type": "integer"}}, "required": [f"key{i}"],
            "additionalProperties": False}


@pytest.fixture(scope="module")
def tokenizer(smollm2_ckpt):
    return AutoTokenizer.from_pretrained(smollm2_ckpt)


def _compiler(tokenizer, **limits) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, len(tokenizer), tokenizer.eos_token_id, GrammarLimits(**limits))


def test_cache_is_an_lru_bounded_by_count_and_bytes(tokenizer):
    compiler = _compiler(tokenizer, cache_entries=4)
    for i in range(10):
        compiler.check(SamplingParams(json_schema=_schema(i)))
    entries, size = compiler.cached
    assert entries == 4 and compiler.misses == 10
    compiler.check(SamplingParams(json_schema=_schema(9)))  # the newest stayed
    assert compiler.hits == 1
    one = size // 4
    compiler = _compiler(tokenizer, cache_source_bytes=3 * one)
    for i in range(10):
        compiler.check(SamplingParams(json_schema=_schema(i)))
    entries, size = compiler.cached
    assert entries == 3 and size <= 3 * one


def test_bounds_are_checked_before_any_compile(tokenizer):
    compiler = _compiler(tokenizer, max_source_bytes=1000, max_branches=8)
    big = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(100)}}
    with pytest.raises(InputError, match="at most 1000 .*max_source_bytes"):
        compiler.submit(SamplingParams(json_schema=big))
    with pytest.raises(InputError, match="anyOf of 9 branches .*at most 8 .*max_branches"):
        compiler.check(SamplingParams(json_schema={"items": {"anyOf": [_schema(i) for i in range(9)]}}))
    assert compiler.misses == 0


def test_a_compile_over_the_time_budget_is_refused_and_stays_refused(tokenizer):
    compiler = _compiler(tokenizer, compile_timeout_s=0.0)  # every compile takes longer than 0 s
    params = SamplingParams(json_schema=_schema(0))
    with pytest.raises(InputError, match="over this server's 0 s .*compile_timeout_s"):
        compiler.submit(params).result()
    with pytest.raises(InputError, match="compile_timeout_s"):
        compiler.check(params)  # refused from memory: not compiled again
    assert compiler.misses == 0 and compiler.cached == (0, 0)


def test_verdict_replays_an_answer_through_its_grammar(tokenizer):
    compiler = _compiler(tokenizer)
    given_up = compiler.verdict(SamplingParams(json_schema=GIVES_UP), tokenizer.encode('{"'))
    assert given_up is not None and "gave up" in given_up and "\n" not in given_up
    person = SamplingParams(json_schema=_schema(1))
    assert compiler.verdict(person, tokenizer.encode('{"key1": 42}')) is None
    assert "ended before" in compiler.verdict(person, tokenizer.encode('{"key1": 4'))


# --- through the server -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def client(tiny_bpe_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tiny_bpe_server.url}/v1", api_key="none", max_retries=0, timeout=120)


def _format(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}


ASK = [{"role": "user", "content": "Answer in JSON."}]


def test_server_refuses_schemas_over_the_limits_naming_them(client):
    with pytest.raises(openai.BadRequestError, match="max_branches"):
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8,
                                       response_format=_format({"anyOf": [_schema(i) for i in range(300)]}))
    huge = {"type": "object", "properties": {f"property_{i}": {"type": "string"} for i in range(3000)}}
    with pytest.raises(openai.BadRequestError, match="max_source_bytes"):
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, response_format=_format(huge))
    tools = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(MAX_TOOLS + 1)]
    with pytest.raises(openai.BadRequestError, match=f"at most {MAX_TOOLS}"):
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, tools=tools, tool_choice="required")


def test_prompt_length_is_checked_before_the_schema_is_compiled(client):
    # the schema alone would be refused by the compiler ("not" cannot be enforced); the prompt's length is first
    long_prompt = [{"role": "user", "content": "word " * 1000}]
    with pytest.raises(openai.BadRequestError, match="max_input_tokens"):
        client.chat.completions.create(model=MODEL, messages=long_prompt, max_tokens=8,
                                       response_format=_format({"not": {"type": "string"}}))


def test_an_answer_the_grammar_engine_gave_up_on_is_an_error_not_a_stop(client, tiny_bpe_server, tokenizer):
    key, = tokenizer.encode('{"')
    bias = {str(key): 100}
    with pytest.raises(openai.BadRequestError, match="gave up on this json_schema mid-answer"):
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, logit_bias=bias,
                                       response_format=_format(GIVES_UP))
    stream = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, stream=True, logit_bias=bias,
                                            response_format=_format(GIVES_UP))
    with pytest.raises(openai.APIError, match="gave up"):
        for chunk in stream:
            assert not chunk.choices or chunk.choices[0].finish_reason is None
    with pytest.raises(openai.BadRequestError, match="gave up"):
        client.completions.create(model=MODEL, prompt="JSON:", max_tokens=40, logit_bias=bias,
                                  extra_body={"guided_json": GIVES_UP})
    assert httpx.get(f"{tiny_bpe_server.url}/health", timeout=30).status_code == 200



def test_the_library_reports_an_answer_the_grammar_gave_up_on_as_an_error(tiny_bpe_engine, tokenizer):
    """LLM.generate / stream (no server) replay a constrained answer that ended on EOS as the server does:
    finish_reason "error" with the reason in stop_reason (it said "stop" for an answer that fails its schema)."""
    from engine_builder import LLM

    key, = tokenizer.encode('{"')
    params = SamplingParams(max_new_tokens=40, temperature=0, json_schema=GIVES_UP, logit_bias={key: 100})
    with LLM(tiny_bpe_engine) as llm:
        out = llm.generate("Answer in JSON.", params)[0]
        with llm.stream("Answer in JSON.", params) as stream:
            "".join(stream)
        followed = llm.generate("Answer in JSON.", SamplingParams(max_new_tokens=40, temperature=0,
                                                                  json_schema=_schema(1)))[0]
    assert out.finish_reason == "error" and "gave up on this json_schema mid-answer" in out.stop_reason
    assert stream.output.finish_reason == "error"
    assert followed.finish_reason in ("stop", "length")  # a schema llguidance can follow is unaffected


def test_the_library_refuses_a_logit_bias_id_past_the_vocabulary(tiny_bpe_engine):
    """LLM.generate / stream refuse a logit_bias id the model has no logit for, naming it and the vocabulary, before
    any work (as the server refuses it with a 400; the sampler skipped it silently); the vocabulary's last id works."""
    from engine_builder import LLM

    with LLM(tiny_bpe_engine) as llm:
        vocab = llm.backend.vocab_size
        refused = SamplingParams(max_new_tokens=4, temperature=0, logit_bias={1: 2.0, vocab: 5.0})
        needle = rf"logit_bias token id {vocab} is past this model's vocabulary of {vocab} ids"
        with pytest.raises(InputError, match=needle):
            llm.generate(["Hi", "there"], [SamplingParams(max_new_tokens=4), refused])
        with pytest.raises(InputError, match=needle):
            llm.stream("Hi", refused)
        out = llm.generate("Hi", SamplingParams(max_new_tokens=1, temperature=0, logit_bias={vocab - 1: 100}))[0]
    assert out.token_ids == (vocab - 1,)
