"""The API side never waits for a request's preparation: while one request's tokenization, chat template
or grammar compilation is held (by an event, in a worker thread), /health, /metrics, /v1/models and
admission (the 429) still answer; a request refused for a full queue is never tokenized."""

import json
import socket
import threading

import httpx
import pytest
from test_server_harness import MODEL, engine_idle, serve, tiny_engine, wait_until

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
ANSWER_TIMEOUT_S = 30          # generous: a blocked event loop never answers at all


def held(monkeypatch, owner, name: str) -> tuple[threading.Event, threading.Event]:
    """owner.name(...) first sets `entered`, then waits for `release`, then runs."""
    entered, release, original = threading.Event(), threading.Event(), getattr(owner, name)

    def wrapper(*args, **kwargs):
        entered.set()
        release.wait()
        return original(*args, **kwargs)
    monkeypatch.setattr(owner, name, wrapper)
    return entered, release


def post_in_background(server, route: str, body: dict, answers: list) -> threading.Thread:
    thread = threading.Thread(target=lambda: answers.append(httpx.post(server.url(route), json=body, timeout=120)),
                              daemon=True)
    thread.start()
    return thread


def assert_service_routes_answer(server) -> None:
    for path in ("/health", "/metrics", "/v1/models"):
        assert httpx.get(server.url(path), timeout=ANSWER_TIMEOUT_S).status_code == 200, path


@pytest.mark.parametrize("route, body, owner, name", [
    (COMPLETIONS, {"prompt": "abc abc abc"}, "engine", "encode"),
    (CHAT, {"messages": [{"role": "user", "content": "hello"}]}, "tokenizer", "apply_chat_template"),
    (COMPLETIONS, {"prompt": "abc", "response_format": {"type": "json_object"}}, "grammars", "check"),
], ids=["tokenization", "chat template", "grammar compilation"])
def test_the_api_answers_while_a_request_is_prepared(monkeypatch, route, body, owner, name):
    engine = tiny_engine(max_num_seqs=1)
    target = {"engine": engine, "tokenizer": engine.tokenizer, "grammars": engine.grammars}[owner]
    with serve(engine, max_queue=0) as server:        # one seat: the held request fills the bound
        entered, release = held(monkeypatch, target, name)
        answers: list[httpx.Response] = []
        thread = post_in_background(server, route, {"model": MODEL, "max_tokens": 4, **body}, answers)
        try:
            assert entered.wait(ANSWER_TIMEOUT_S), "the request's preparation never began"
            assert_service_routes_answer(server)
            refused = httpx.post(server.url(COMPLETIONS), json={"model": MODEL, "prompt": "x", "max_tokens": 1},
                                 timeout=ANSWER_TIMEOUT_S)
            assert refused.status_code == 429 and refused.json()["error"]["admitted"] == 1
        finally:
            release.set()
        thread.join(120)
        assert [answer.status_code for answer in answers] == [200]
        wait_until(lambda: engine_idle(engine), what="engine idle")
        assert server.app.state.serving.admitted == 0


def test_a_refused_request_is_never_tokenized(monkeypatch):
    engine = tiny_engine(max_num_seqs=1)
    with serve(engine, max_queue=0) as server:
        entered, release = held(monkeypatch, engine, "encode")
        calls, encode = [], engine.encode      # the held wrapper; the text prompts tokenized (the engine re-checks ids)
        monkeypatch.setattr(engine, "encode", lambda prompt: (isinstance(prompt, str) and calls.append(prompt),
                                                              encode(prompt))[1])
        answers: list[httpx.Response] = []
        thread = post_in_background(server, COMPLETIONS, {"model": MODEL, "prompt": "first", "max_tokens": 2},
                                    answers)
        try:
            assert entered.wait(ANSWER_TIMEOUT_S)
            for _ in range(5):
                refused = httpx.post(server.url(COMPLETIONS), json={"model": MODEL, "prompt": "later", "max_tokens": 2},
                                     timeout=ANSWER_TIMEOUT_S)
                assert refused.status_code == 429
        finally:
            release.set()
        thread.join(120)
        assert [answer.status_code for answer in answers] == [200]
        assert calls == ["first"]


def test_a_client_gone_while_its_request_is_prepared_gives_its_seat_back(monkeypatch):
    engine = tiny_engine(max_num_seqs=1)
    with serve(engine, max_queue=0) as server:
        entered, release = held(monkeypatch, engine, "encode")
        body = json.dumps({"model": MODEL, "prompt": "abc", "max_tokens": 2}).encode()
        try:
            with socket.create_connection(("127.0.0.1", int(server.base_url.rsplit(":", 1)[1]))) as client:
                client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                assert entered.wait(ANSWER_TIMEOUT_S), "the request's preparation never began"
        finally:                                  # the client has hung up while its prompt was held
            release.set()
        wait_until(lambda: server.app.state.serving.admitted == 0, what="the seat to be given back")
        wait_until(lambda: engine_idle(engine), what="engine idle")
        answer = httpx.post(server.url(COMPLETIONS), content=body, headers={"Content-Type": "application/json"},
                            timeout=ANSWER_TIMEOUT_S)
        assert answer.status_code == 200
