"""Tool calling on /v1/chat/completions with the openai client against a real `trtbuild serve` (SmolLM2)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from engine_builder.server.tool_calls import Tool, ToolPlan, may_be_call, parse

MODEL = "engine"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 30}},
                   "required": ["timezone"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}


@pytest.fixture(scope="module")
def client(smol_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{smol_server.url}/v1", api_key="none", max_retries=0, timeout=120)


def _check_call(call) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


def test_named_function_streamed_equals_whole(client):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice=choice,
                                       max_tokens=60)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.function.name == "get_weather"
    args = _check_call(call)
    assert "paris" in args["city"].lower()

    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME],
                                                 tool_choice=choice, max_tokens=60, stream=True))
    deltas = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather" and deltas[0].id.startswith("call_")
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_required_calls_validate(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=80)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1
    _check_call(c.message.tool_calls[0])


def test_required_parallel_calls_cut_by_max_tokens_keep_the_complete_ones(client):
    """SmolLM2 repeats its call until max_tokens when several are allowed: the answer carried no tool_calls,
    only the cut JSON as content (issue 36 LOW 10). The calls it completed are kept, and finish_reason says
    the answer was cut; streamed, the same calls at the end."""
    kwargs = dict(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=60,
                  temperature=0)
    c = client.chat.completions.create(**kwargs).choices[0]
    assert c.finish_reason == "length" and c.message.content is None and c.message.tool_calls
    for call in c.message.tool_calls:
        _check_call(call)
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    streamed = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
    assert [(d.function.name, d.function.arguments) for d in streamed] == [
        (call.function.name, call.function.arguments) for call in c.message.tool_calls]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_required_mode_parses_the_complete_calls_of_a_cut_array():
    required = ToolPlan("required", (Tool.model_validate(WEATHER), Tool.model_validate(TIME)))
    whole = '[{"name": "get_time", "arguments": {"timezone": "CET"}}]'
    assert [c["function"]["name"] for c in parse(whole, required)[1]] == ["get_time"]
    call = '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}'
    content, calls = parse(f"[{call},\n {call}, {call[:30]}", required)
    assert content is None and [json.loads(c["function"]["arguments"])["city"] for c in calls] == ["Oslo", "Oslo"]
    assert parse(f"[{call[:30]}", required) == (f"[{call[:30]}", [])  # nothing complete: the text, as before


def test_tool_result_in_history_and_tool_choice_none(client):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temperature": 31, "sky": "sunny"})}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], tool_choice="none",
                                       max_tokens=40, temperature=0)
    c = r.choices[0]
    assert c.message.tool_calls is None and c.finish_reason in ("stop", "length")
    assert "31" in c.message.content  # the model read the tool's answer
    without = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, temperature=0)
    assert "31" not in without.choices[0].message.content


def test_bad_tool_choice_is_refused(client):
    with pytest.raises(openai.BadRequestError, match="get_time"):
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    with pytest.raises(openai.BadRequestError, match="needs tools"):
        client.chat.completions.create(model=MODEL, messages=ASK, tool_choice="required")


def test_auto_mode_parses_hermes_and_bare_calls():
    tools = (Tool.model_validate(WEATHER),)
    auto = ToolPlan("auto", tools)
    content, calls = parse('Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", '
                           '"unit": "celsius"}}\n</tool_call>', auto)
    assert content == "Sure." and json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo", "unit": "celsius"}
    content, calls = parse('{"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}}', auto)
    assert content is None and calls[0]["function"]["name"] == "get_weather"
    assert parse('{"name": "unknown", "arguments": {}}', auto) == ('{"name": "unknown", "arguments": {}}', [])
    assert parse("It is sunny.", auto) == ("It is sunny.", [])
    assert may_be_call("<tool") and may_be_call(' {"na') and not may_be_call("It is")
