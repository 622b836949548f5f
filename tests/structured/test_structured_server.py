"""Structured output through a real `trtbuild serve` with the official openai client (and TGI's grammar
through huggingface_hub): every strict answer that finishes validates against its schema."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from huggingface_hub import InferenceClient
from schemas import CASES, PERSON, UNSUPPORTED

MODEL = "engine"  # serve names the model after its engine dir (both fixtures: engine/)


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)


def _strict(schema, name="answer") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.mark.parametrize("prompt,schema", CASES[:4], ids=[f"schema{i}" for i in range(4)])
def test_chat_json_schema_strict_smollm2(smol_server, prompt, schema):
    r = _client(smol_server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], response_format=_strict(schema),
        max_completion_tokens=96)
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_streamed_and_completions(smol_server):
    client = _client(smol_server)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        response_format={"type": "json_object"}, max_tokens=80, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop", text
    assert isinstance(json.loads(text), dict)
    # /v1/completions takes response_format too (a vLLM extension of the legacy API)
    r = client.completions.create(model=MODEL, prompt="A person as JSON:", max_tokens=60,
                                  extra_body={"response_format": _strict(PERSON)})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)


def test_tiny_model_every_finished_answer_validates(tiny_bpe_server):
    client = _client(tiny_bpe_server)
    finished = 0
    for i, (prompt, schema) in enumerate(CASES):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], response_format=_strict(schema),
            max_tokens=120, temperature=1.3, seed=i)
        if r.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(r.choices[0].message.content), schema)
            finished += 1
    assert finished >= len(CASES) // 2


@pytest.mark.parametrize("keyword", sorted(UNSUPPORTED))
def test_unsupported_schema_feature_is_a_400_naming_it(smol_server, keyword):
    with pytest.raises(openai.BadRequestError, match=f'"{keyword}"') as exc:
        _client(smol_server).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}],
            response_format=_strict(UNSUPPORTED[keyword]), max_tokens=4)
    assert exc.value.status_code == 400


def test_tgi_grammar_json_and_regex(smol_server):
    client = InferenceClient(base_url=smol_server.url)
    text = client.text_generation("A person as JSON:", max_new_tokens=60,
                                  grammar={"type": "json", "value": PERSON})
    jsonschema.validate(json.loads(text), PERSON)
    text = client.text_generation("The year Paris hosted the Olympics:", max_new_tokens=8,
                                  grammar={"type": "regex", "value": "(19|20)[0-9]{2}"})
    assert len(text) == 4 and text[:2] in ("19", "20") and text.isdigit()
    r = httpx.post(f"{smol_server.url}/generate", json={"inputs": "x", "parameters": {
        "grammar": {"type": "json", "value": UNSUPPORTED["not"]}}}, timeout=60)
    assert r.status_code == 400 and '"not"' in r.json()["error"]
