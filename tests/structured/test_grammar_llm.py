"""Constrained decoding through LLM.generate: every finished answer matches its constraint."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from schemas import CASES, UNSUPPORTED

from engine_builder import LLM, SamplingParams
from engine_builder.util.errors import InputError, UnsupportedError


def _check_all(outputs, schemas) -> int:
    finished = 0
    for out, schema in zip(outputs, schemas):
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.text), schema)
            finished += 1
    return finished


def test_smollm2_json_schemas_greedy(smollm2_llm):
    params = [smollm2_llm.default_params(max_new_tokens=96, json_schema=schema) for _, schema in CASES]
    ids = [smollm2_llm.encode_chat([{"role": "user", "content": prompt}]) for prompt, _ in CASES]
    outputs = smollm2_llm.generate(prompt_token_ids=ids, params=params)
    assert _check_all(outputs, [s for _, s in CASES]) == len(CASES), [o.text for o in outputs]


def test_tiny_random_model_json_schemas_sampled(tiny_bpe_engine):
    # random weights at temperature 1.5: the grammar alone keeps the output valid
    with LLM(tiny_bpe_engine, backend="onnxruntime") as llm:
        schemas = [s for _, s in CASES] * 2
        params = [SamplingParams(max_new_tokens=120, temperature=1.5, seed=i, json_schema=s,
                                 stop_token_ids=[2]) for i, s in enumerate(schemas)]
        outputs = llm.generate([p for p, _ in CASES] * 2, params)
        finished = _check_all(outputs, schemas)
        assert finished >= len(schemas) // 2, [o.text for o in outputs]
        for out in outputs:  # an unfinished one is a valid prefix: it ran out of tokens, nothing else
            assert out.finish_reason in ("stop", "length")
        compiler = llm.generator.grammars
        assert compiler.misses == len(CASES) and compiler.hits == len(CASES)  # one compile per schema


def test_choice_and_regex(smollm2_llm):
    msgs = [{"role": "user", "content": "Is Paris in France? Answer yes or no."}]
    out = smollm2_llm.chat(msgs, smollm2_llm.default_params(max_new_tokens=8, choice=["yes", "no"]))[0]
    assert out.text in ("yes", "no") and out.finish_reason == "stop"
    msgs = [{"role": "user", "content": "Give me a US phone number."}]
    out = smollm2_llm.chat(msgs, smollm2_llm.default_params(max_new_tokens=20, regex=r"[0-9]{3}-[0-9]{3}-[0-9]{4}"))[0]
    assert re.fullmatch(r"[0-9]{3}-[0-9]{3}-[0-9]{4}", out.text) and out.finish_reason == "stop"


@pytest.mark.parametrize("keyword", sorted(UNSUPPORTED))
def test_unsupported_schema_keyword_is_refused(smollm2_llm, keyword):
    with pytest.raises(UnsupportedError, match=f'"{keyword}"'):
        smollm2_llm.generate("x", SamplingParams(json_schema=UNSUPPORTED[keyword]))


def test_bad_constraints():
    with pytest.raises(InputError, match="at most one"):
        SamplingParams(json_schema={"type": "object"}, regex="a")
    with pytest.raises(InputError, match="not valid JSON"):
        SamplingParams(json_schema="{nope")
    with pytest.raises(InputError, match="logit_bias values"):
        SamplingParams(logit_bias={1: 200})
    p = SamplingParams(json_schema={"b": 1, "a": {"type": "object"}}, choice=None, logit_bias={"5": -100})
    assert p.json_schema == '{"a":{"type":"object"},"b":1}' and p.logit_bias == ((5, -100.0),)
    hash(p)  # still a hashable, frozen value
