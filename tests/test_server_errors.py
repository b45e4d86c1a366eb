"""Bad input gets its status code and an OpenAI-style error body; the server keeps serving."""

import httpx
import openai
import pytest
from test_server_harness import MODEL, engine_idle, metric, serve, sse_payloads, wait_until

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
LONG_PROMPT = "x" * 300          # 301 tokens with BOS: beyond the 256-token window

# (route, body: dict or raw bytes, status, param, code)
CASES = [
    (COMPLETIONS, b"{not json", 400, None, "invalid_json"),
    (COMPLETIONS, b"\xff\xfe\x00garbage", 400, None, "invalid_json"),
    (COMPLETIONS, b"[1, 2]", 400, None, "invalid_value"),
    (COMPLETIONS, {}, 400, "prompt", "invalid_value"),
    (COMPLETIONS, {"prompt": 5}, 400, "prompt", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "temperature": "hot"}, 400, "temperature", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "temperature": -1}, 400, "temperature", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "top_p": 0}, 400, "top_p", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": -3}, 400, "max_tokens", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 10_000}, 400, "max_tokens", "context_length_exceeded"),
    (COMPLETIONS, {"prompt": LONG_PROMPT}, 400, "prompt", "context_length_exceeded"),
    (COMPLETIONS, {"prompt": "x", "stream": "yes"}, 400, "stream", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "stop": [""]}, 400, "stop.0", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "seed": -1}, 400, "seed", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "model": "gpt-4"}, 404, "model", "model_not_found"),
    (COMPLETIONS, {"prompt": "x", "n": 99}, 400, "n", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "n": 3, "best_of": 2}, 400, "best_of", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "best_of": 3, "stream": True}, 400, "best_of", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "best_of": 17}, 400, "best_of", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"a": 10}}, 400, "logit_bias", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"50": 1000}}, 400, "logit_bias", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"99999": 1}}, 400, None, "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "logprobs": 21}, 400, "logprobs", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "prompt_logprobs": 1}, 400, "prompt_logprobs", "unsupported_parameter"),
    (COMPLETIONS, {"prompt": "x", "suffix": "y"}, 400, "suffix", "unsupported_parameter"),
    (COMPLETIONS, {"prompt": "x", "functions": [{"name": "f"}]}, 400, "functions", "unsupported_parameter"),
    (COMPLETIONS, {"prompt": "x", "min_p": 0.1}, 400, "min_p", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "presence_penalty": 3}, 400, "presence_penalty", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "min_tokens": 40, "max_tokens": 8}, 400, "min_tokens", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options", None),
    (COMPLETIONS, {"prompt": ["a", "b"]}, 400, "prompt", "unsupported_parameter"),
    (COMPLETIONS, {"prompt": []}, 400, "prompt", "invalid_value"),
    (COMPLETIONS, {"prompt": [1, 99_999]}, 400, "prompt", "invalid_value"),
    (CHAT, {"messages": []}, 400, "messages", "invalid_value"),
    (CHAT, {"messages": "hi"}, 400, "messages", "invalid_value"),
    (CHAT, {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role", "invalid_value"),
    (CHAT, {"messages": [{"role": "user"}]}, 400, "messages.0.content", "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages.0.content", "unsupported_content"),
    (CHAT, {"messages": USER, "tools": [{"type": "function"}]}, 400, "tools.0", "invalid_value"),
    (CHAT, {"messages": USER, "tool_choice": "required"}, 400, "tool_choice", "invalid_value"),
    (CHAT, {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs", "invalid_value"),
    (CHAT, {"messages": USER, "modalities": ["audio"]}, 400, "modalities", "unsupported_parameter"),
    (CHAT, {"messages": USER, "max_completion_tokens": 0}, 400, "max_completion_tokens", "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": LONG_PROMPT}]}, 400, "messages", "context_length_exceeded"),
]


@pytest.fixture(scope="module")
def server():
    with serve(max_body_bytes=4096) as running:
        yield running


def check_error_body(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error


@pytest.mark.parametrize("route, body, status, param, code", CASES,
                         ids=[f"{i}-{c[0].rsplit('/', 1)[-1]}" for i, c in enumerate(CASES)])
def test_bad_request_gets_status_and_error_body(server, route, body, status, param, code):
    if isinstance(body, bytes):
        response = httpx.post(server.url(route), content=body, headers={"content-type": "application/json"})
    else:
        response = httpx.post(server.url(route), json=body)
    error = check_error_body(response, status)
    assert (error["param"], error["code"]) == (param, code)


def test_body_over_the_limit_is_413(server):
    error = check_error_body(httpx.post(server.url(COMPLETIONS), json={"prompt": "x" * 5000}), 413)
    assert error["code"] == "body_too_large"

    def chunks():          # no Content-Length: the limit holds while reading
        for _ in range(10):
            yield b" " * 1000
    response = httpx.post(server.url(COMPLETIONS), content=chunks(), headers={"content-type": "application/json"})
    check_error_body(response, 413)


def test_unknown_route_and_wrong_method(server):
    check_error_body(httpx.get(server.url("/v1/nothing")), 404)
    check_error_body(httpx.get(server.url(COMPLETIONS)), 405)


def test_openai_client_raises_typed_errors(server):
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="x", n=3, best_of=2)
    assert caught.value.body["param"] == "best_of"


def test_server_keeps_serving_after_bad_input(server):
    for route, body, *_ in CASES:
        httpx.post(server.url(route), json=body) if isinstance(body, dict) else \
            httpx.post(server.url(route), content=body)
    response = httpx.post(server.url(COMPLETIONS), json={"model": MODEL, "prompt": "ok", "max_tokens": 4},
                          timeout=60)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4
    assert httpx.get(server.url("/health")).status_code == 200
    wait_until(lambda: engine_idle(server.engine), what="engine idle")
    samples = server.metrics()
    assert metric(samples, "specwise:requests_total", route=COMPLETIONS, status=500) == 0
    assert metric(samples, "specwise:requests_finished_total", finish_reason="length") == 1


def fail_engine_step(monkeypatch, engine, at_call: int) -> None:
    """The runner raises on its `at_call`-th call, as a broken kernel would."""
    original, calls = engine.runner.execute, []

    def execute(*args, **kwargs):
        calls.append(1)
        if len(calls) == at_call:
            raise RuntimeError("injected failure")
        return original(*args, **kwargs)
    monkeypatch.setattr(engine.runner, "execute", execute)


def test_engine_failure_fails_the_request_not_the_server(server, monkeypatch):
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 10, "ignore_eos": True}
    fail_engine_step(monkeypatch, server.engine, at_call=1)
    error = check_error_body(httpx.post(server.url(COMPLETIONS), json=body, timeout=60), 500)
    assert error["code"] == "engine_error"
    fail_engine_step(monkeypatch, server.engine, at_call=3)        # after the stream has begun
    with httpx.stream("POST", server.url(COMPLETIONS), json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200
        payloads = sse_payloads(response.iter_lines())
    assert payloads[-2]["error"]["code"] == "engine_error" and payloads[-1] == "[DONE]"
    monkeypatch.undo()
    assert httpx.post(server.url(COMPLETIONS), json=body, timeout=60).status_code == 200
    wait_until(lambda: engine_idle(server.engine), what="engine idle")
    assert metric(server.metrics(), "specwise:requests_finished_total", finish_reason="error") == 2
