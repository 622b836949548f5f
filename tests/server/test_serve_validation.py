"""Every request the server refuses, on a live server with tight limits: the status, the protocol's
error shape (OpenAI's on /v1/*, TGI's elsewhere) and a message that names what to fix."""

from __future__ import annotations

import httpx
import openai
import pytest
from live_server import metrics, sse_data, wait_idle

KEY = "test-key-123"
SERVER_ARGS = ("--model-name", "smollm2", "--api-key", KEY, "--max-concurrent-requests", "1",
               "--max-input-tokens", "32", "--max-total-tokens", "64")
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
LONG_PROMPT = "one two three four five six seven eight nine ten " * 4  # 40 tokens > 32


def post(server, path, body=None, *, content=None, headers=AUTH):
    return httpx.post(f"{server.url}{path}", json=body, content=content, headers=headers, timeout=120)


def assert_openai_error(r, status, *needles):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"}
    for needle in needles:
        assert needle in err["message"], err["message"]


def assert_tgi_error(r, status, error_type, *needles):
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error_type"] == error_type
    for needle in needles:
        assert needle in body["error"], body["error"]


def test_missing_or_wrong_api_key_is_401(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = post(server, "/v1/chat/completions", CHAT, headers=headers)
        assert_openai_error(r, 401, "Authorization: Bearer")
        assert r.headers["www-authenticate"] == "Bearer"
        assert_tgi_error(post(server, "/generate", {"inputs": "Hi"}, headers=headers), 401, "authentication")
    # checked before the body is read: a malformed body without a key is still 401
    assert post(server, "/generate", content=b"{", headers={}).status_code == 401
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    assert openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY).models.list().data[0].id == "smollm2"


def test_health_and_metrics_need_no_key(server):
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert "trtbuild_requests_rejected_total" in httpx.get(f"{server.url}/metrics").text


def test_malformed_json_is_400_on_openai_routes_and_422_on_tgi_routes(server):
    r = post(server, "/v1/completions", content=b'{"prompt": "Hi",', headers={**AUTH, "Content-Type":
                                                                          "application/json"})
    assert_openai_error(r, 400, "not valid JSON")
    r = post(server, "/generate", content=b"not json", headers={**AUTH, "Content-Type": "application/json"})
    assert_tgi_error(r, 422, "validation", "not valid JSON")


@pytest.mark.parametrize("path, body, needle", [
    ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, "messages"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, "tools.0.function: Field required"),
    ("/v1/chat/completions", {**CHAT, "n": 17, "stream": True}, "n must be in [1, 16]"),
    ("/v1/chat/completions", {**CHAT, "top_p": 1.5}, "top_p must be in (0, 1]"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs needs logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "Hi"}]}, "messages.0.role"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 0}, "max_tokens must be >= 1"),
    ("/v1/completions", {"prompt": ["Hi", "there"]}, "one prompt"),
    ("/v1/completions", {"prompt": "Hi", "presence_penalty": 5}, "presence_penalty"),
    ("/v1/completions", {}, "prompt: Field required"),
    ("/v1/chat/completions", {**CHAT, "temperature": 1e308}, "temperature must be in [0, 100]"),
    ("/v1/chat/completions", {**CHAT, "stop": ""}, "non-empty strings"),  # as stop: [""] is
    ("/v1/completions", {"prompt": "Hi", "logit_bias": {"49152": 5}}, "logit_bias token ids must be in [0, 49152)"),
])
def test_bad_openai_fields_are_400(server, path, body, needle):
    assert_openai_error(post(server, path, body), 400, needle)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {**CHAT, "temperature": "0.5"}, "temperature"),  # a string is not a number
    ("/v1/chat/completions", {**CHAT, "n": "2"}, "n"),
    ("/v1/chat/completions", {**CHAT, "stream": "true"}, "stream"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 2.5}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "logprobs": 1}, "logprobs"),
    ("/v1/chat/completions", {**CHAT, "stop": 7}, "stop"),
    ("/v1/completions", {"prompt": "Hi", "seed": True}, "seed"),
    ("/v1/completions", {"prompt": "Hi", "echo": "yes"}, "echo"),
    ("/v1/completions", {"prompt": "Hi", "logit_bias": {"5": "up"}}, "logit_bias.5"),
])
def test_wrong_types_are_400_naming_the_field(server, path, body, param):
    r = post(server, path, body)
    assert_openai_error(r, 400, f"{param}: ")
    assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError, match=param):  # what the official client raises for it
        client.post(path.removeprefix("/v1"), body=body, cast_to=object)


@pytest.mark.parametrize("body, needle", [
    ({"parameters": {}}, "inputs: Field required"),
    ({"inputs": "Hi", "parameters": {"top_k": "x"}}, "parameters.top_k"),
    ({"inputs": "Hi", "parameters": {"max_new_tokens": -3}}, "max_new_tokens must be >= 1"),
    ({"inputs": "Hi", "parameters": {"watermark": True}}, "watermark are not supported"),
    ({"inputs": "Hi", "parameters": {"repetition_penalty": 0}}, "repetition_penalty must be in (0, 100]"),
    ({"inputs": "Hi", "bogus": 1}, "bogus: Extra inputs are not permitted"),
])
def test_bad_tgi_fields_are_422(server, body, needle):
    assert_tgi_error(post(server, "/generate", body), 422, "validation", needle)


def test_prompt_over_max_input_tokens_is_refused_naming_the_limit(server):
    assert_openai_error(post(server, "/v1/completions", {"prompt": LONG_PROMPT, "max_tokens": 1}), 400,
                        "max_input_tokens", "at most 32")
    assert_tgi_error(post(server, "/generate", {"inputs": LONG_PROMPT}), 422, "validation", "max_input_tokens")


def test_prompt_plus_new_tokens_over_max_total_tokens_is_refused_naming_the_limit(server):
    r = post(server, "/v1/chat/completions", {**CHAT, "max_tokens": 60})
    assert_openai_error(r, 400, "max_total_tokens 64", "max_tokens 60")
    r = post(server, "/generate", {"inputs": "Hi there", "parameters": {"max_new_tokens": 63}})
    assert_tgi_error(r, 422, "validation", "max_total_tokens 64", "ask for at most 62")
    # without max_new_tokens the server's default shrinks to the room left instead of failing
    r = post(server, "/generate", {"inputs": "Hi there", "parameters": {"details": True}})
    assert r.status_code == 200 and r.json()["details"]["generated_tokens"] <= 62


def test_executor_input_error_is_400(server):
    # token ids outside the vocab pass the server's length checks; Executor.submit refuses them
    assert_openai_error(post(server, "/v1/completions", {"prompt": [5, 99999999], "max_tokens": 2}), 400,
                        "prompt token ids must be in [0, 49152)")


def test_unknown_model_or_route_is_404(server):
    assert_openai_error(post(server, "/v1/chat/completions", {**CHAT, "model": "gpt-4o"}), 404, "'gpt-4o'",
                        "smollm2")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    assert_openai_error(post(server, "/v1/no_such_route", {"input": "Hi"}), 404, "no route")
    assert_tgi_error(post(server, "/no_such_route", {"inputs": "Hi"}), 404, "not_found", "no route")


def test_over_max_concurrent_requests_is_429(server):
    """--max-concurrent-requests 1: while one stream runs, the next request is refused at once."""
    before = metrics(server.url).get('trtbuild_requests_rejected_total{status="429"}', 0)
    body = {"prompt": "1, 2, 3,", "max_tokens": 50, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=120) as stream:
        assert stream.status_code == 200
        events = sse_data(stream.iter_lines())  # held: a dropped iterator would close the connection
        next(events)  # admitted and generating
        r = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        assert_openai_error(r, 429, "max_concurrent_requests 1")
        assert r.headers["retry-after"] == "1"
        assert_tgi_error(post(server, "/generate", {"inputs": "Hi"}), 429, "overloaded", "retry later")
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model="smollm2", messages=CHAT["messages"], max_tokens=2)
    m = wait_idle(server.url)  # leaving the stream cancelled it and freed its slot
    assert m['trtbuild_requests_rejected_total{status="429"}'] == before + 3
    assert post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2}).status_code == 200
