"""The official `openai` client, every parameter of issue 16, streamed and not, against a live server.

Each case is one request; the checks are on what the client parses: choices, usage (also in
every chunk with continuous_usage_stats), logprobs, tool calls, JSON that validates. Bad
structured-output requests get a 400 naming the problem, and the server keeps serving.
"""

import json

import httpx
import jsonschema
import openai
import pytest
import torch
from test_server_harness import MODEL, TOOLS_ENGINE, engine_idle, metric, serve, tiny_engine, wait_until

ECHO_PROMPT = "The cat sat on the"
USER = [{"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi"}]}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "tags", "n"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"],
    "additionalProperties": False}}},
         {"type": "function", "function": {"name": "time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
             "additionalProperties": False}}}]
CHAT_CASES = {
    "max_completion_tokens": dict(max_completion_tokens=5),
    "penalties": dict(max_tokens=6, presence_penalty=0.5, frequency_penalty=0.5,
                      extra_body={"repetition_penalty": 1.2}),
    "min_tokens_ignore_eos": dict(max_tokens=6, extra_body={"min_tokens": 6, "ignore_eos": True}),
    "seed_stop_user": dict(max_tokens=6, seed=5, temperature=0.9, stop=["zz"], user="u1"),
    "logprobs": dict(max_tokens=5, logprobs=True, top_logprobs=3),
    "n": dict(max_tokens=4, n=3, seed=1, temperature=1.0),
    "logit_bias": dict(max_tokens=4, logit_bias={"65": 100}),
    "vendor_extension": dict(max_tokens=4, extra_body={"some_vendor_flag": True, "top_k": 5}),
    "json_object": dict(max_tokens=120, response_format={"type": "json_object"},
                        extra_body={"guided_json": None}),
    "json_schema": dict(max_tokens=150, response_format={"type": "json_schema",
                                                          "json_schema": {"name": "x", "schema": SCHEMA}}),
    "tools_required": dict(max_tokens=150, tools=TOOLS, tool_choice="required", parallel_tool_calls=False),
    "tools_named": dict(max_tokens=150, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "time"}}),
    "tools_none": dict(max_tokens=4, tools=TOOLS, tool_choice="none"),
}


@pytest.fixture(scope="module")
def server():
    with serve(tiny_engine(**TOOLS_ENGINE)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=120)


def check_chat_choices(name: str, choices, expected_n: int) -> None:
    assert len(choices) == expected_n
    for choice in choices:
        message = choice["message"]
        if name == "logprobs":
            content = choice["logprobs"]["content"]
            assert content and all(len(item["top_logprobs"]) == 3 for item in content)
        if name == "logit_bias":
            assert len(message["content"]) == 4 and len(set(message["content"])) == 1   # token 65, every time
        if name == "json_object":       # any object: a random model may not close it within max_tokens
            assert message["content"].startswith("{")
            if choice["finish_reason"] == "stop":
                assert isinstance(json.loads(message["content"]), dict)
        if name == "json_schema":
            jsonschema.validate(json.loads(message["content"]), SCHEMA)
        if name.startswith("tools_") and name != "tools_none":
            assert choice["finish_reason"] == "tool_calls", message
            call = message["tool_calls"][0]
            arguments = json.loads(call["function"]["arguments"])
            tool = next(t for t in TOOLS if t["function"]["name"] == call["function"]["name"])
            jsonschema.validate(arguments, tool["function"]["parameters"])
            if name == "tools_named":
                assert call["function"]["name"] == "time"
        if name == "min_tokens_ignore_eos":
            assert choice["finish_reason"] == "length"


@pytest.mark.parametrize("name", list(CHAT_CASES))
def test_chat_parameter_not_streamed(client, name):
    response = client.chat.completions.create(model=MODEL, messages=USER, **CHAT_CASES[name]).model_dump()
    check_chat_choices(name, response["choices"], CHAT_CASES[name].get("n", 1))
    usage = response["usage"]
    assert usage["completion_tokens"] > 0 and usage["total_tokens"] == usage["prompt_tokens"] + \
        usage["completion_tokens"]


@pytest.mark.parametrize("name", list(CHAT_CASES))
def test_chat_parameter_streamed_with_continuous_usage(client, name):
    extra = {**CHAT_CASES[name].get("extra_body", {}),
             "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    stream = client.chat.completions.create(model=MODEL, messages=USER, stream=True,
                                            **{**CHAT_CASES[name], "extra_body": extra})
    chunks = [chunk.model_dump() for chunk in stream]
    assert all(chunk["usage"] is not None for chunk in chunks), "continuous_usage_stats: usage in every chunk"
    final = chunks[-1]
    assert final["choices"] == []
    n = CHAT_CASES[name].get("n", 1)
    texts, calls, finish, logprobs = [""] * n, [[] for _ in range(n)], [None] * n, [[] for _ in range(n)]
    for chunk in chunks[:-1]:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            texts[choice["index"]] += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:       # a call's first delta, then argument fragments
                if call["index"] == len(calls[choice["index"]]):
                    calls[choice["index"]].append(call)
                else:
                    calls[choice["index"]][call["index"]]["function"]["arguments"] += call["function"]["arguments"]
            finish[choice["index"]] = choice["finish_reason"] or finish[choice["index"]]
            logprobs[choice["index"]] += (choice.get("logprobs") or {}).get("content") or []
    choices = [{"message": {"content": text, "tool_calls": call or None}, "finish_reason": reason,
                "logprobs": {"content": lp}} for text, call, reason, lp in zip(texts, calls, finish, logprobs)]
    check_chat_choices(name, choices, n)
    assert final["usage"]["completion_tokens"] == chunks[-2]["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize("stream", [False, True])
def test_completions_logprobs_echo_n_best_of(client, stream):
    kwargs = dict(model=MODEL, prompt="abc", max_tokens=5, logprobs=2, n=2, best_of=2, seed=3, temperature=1.0)
    if not stream:
        response = client.completions.create(**kwargs)
        assert len(response.choices) == 2
        for choice in response.choices:
            assert len(choice.logprobs.tokens) == 5 and all(len(top) <= 2 for top in choice.logprobs.top_logprobs)
        echoed = client.completions.create(model=MODEL, prompt="abc", max_tokens=3, echo=True)
        assert echoed.choices[0].text.startswith("abc")
    else:
        chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
        assert {choice.index for chunk in chunks for choice in chunk.choices} == {0, 1}
        tokens = sum(len(choice.logprobs.tokens) for chunk in chunks for choice in chunk.choices if choice.logprobs)
        assert tokens == 10 and chunks[-1].usage.completion_tokens == 10


def test_best_of_returns_the_n_most_likely_candidates(client):
    """best_of 4, n 2 answers with the two of the four candidates (the choices of n 4, same seeds) whose
    tokens have the highest cumulative logprob, best first; usage counts all four."""
    kwargs = dict(model=MODEL, prompt="abc", max_tokens=6, seed=11, temperature=1.0)
    candidates = client.completions.create(n=4, logprobs=0, **kwargs)
    ranked = sorted(candidates.choices, key=lambda choice: sum(choice.logprobs.token_logprobs), reverse=True)
    for logprobs in (0, None):
        best = client.completions.create(n=2, best_of=4, logprobs=logprobs, **kwargs)
        assert [choice.text for choice in best.choices] == [choice.text for choice in ranked[:2]]
        assert [choice.index for choice in best.choices] == [0, 1]
        assert all((choice.logprobs is None) == (logprobs is None) for choice in best.choices)
        assert best.usage.completion_tokens == candidates.usage.completion_tokens


@pytest.mark.parametrize("choices", [dict(n=3), dict(n=1, best_of=3)])
def test_metrics_count_the_prompt_once_per_request(server, client, choices):
    before = server.metrics()
    response = client.completions.create(model=MODEL, prompt="abcdef", max_tokens=4, temperature=1.0,
                                         extra_body={"ignore_eos": True}, **choices)
    after = server.metrics()

    def delta(name):
        return metric(after, name) - metric(before, name)
    assert delta("specwise:prompt_tokens_total") == response.usage.prompt_tokens == 7     # BOS + 6 bytes
    assert delta("specwise:generation_tokens_total") == response.usage.completion_tokens == 12


def test_echo_with_logprobs_gives_the_prompt_logprobs_of_a_full_forward(server, client):
    """The prompt's tokens first (the first with null), equal to one forward over the prompt; streamed the same."""
    engine = tiny_engine()
    token_ids = engine.encode(ECHO_PROMPT)
    reference = torch.log_softmax(engine.runner.forward([token_ids], [0], [list(range(8))], [len(token_ids)]), -1)
    kwargs = dict(model=MODEL, prompt=ECHO_PROMPT, max_tokens=4, logprobs=2, echo=True, temperature=0)
    whole = client.completions.create(**kwargs).choices[0]
    chunks = list(client.completions.create(stream=True, **kwargs))
    streamed = {key: [value for chunk in chunks for value in getattr(chunk.choices[0].logprobs, key)]
                for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    assert "".join(chunk.choices[0].text for chunk in chunks) == whole.text and whole.text.startswith(ECHO_PROMPT)
    for logprobs in (whole.logprobs.model_dump(), streamed):
        assert len(logprobs["tokens"]) == len(token_ids) + 4
        assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
        for position, token in enumerate(token_ids[1:]):
            assert logprobs["token_logprobs"][position + 1] == pytest.approx(reference[position, token].item(),
                                                                             abs=1e-4)
            assert len(logprobs["top_logprobs"][position + 1]) <= 2
        assert logprobs["text_offset"][len(token_ids)] == len(ECHO_PROMPT)     # the output follows the echo
    assert streamed["tokens"] == whole.logprobs.tokens and streamed["text_offset"] == whole.logprobs.text_offset
    assert streamed["token_logprobs"][1:] == pytest.approx(whole.logprobs.token_logprobs[1:], abs=1e-4)


BAD_STRUCTURED = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
                                                                                          "properties": 5}}}},
     "properties"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}}, "strin"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "format": "no-such-format"}}}}, "format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {f"key{i}": {"type": "string", "pattern": "a{1,%d}" % (i + 900)}
                                         for i in range(2000)}}}}}, "limit"),
    ({"response_format": {"type": "json_schema"}}, "json_schema"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"guided_regex": "(["}, "regex"),
    ({"guided_choice": []}, "choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "one structured"),
]


@pytest.mark.parametrize("extra, words", BAD_STRUCTURED)
def test_bad_structured_output_is_a_400_naming_the_problem(server, extra, words):
    response = httpx.post(server.url("/v1/chat/completions"), timeout=60,
                          json={"model": MODEL, "messages": USER, "max_tokens": 4, **extra})
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]["message"] or words == response.json()["error"]["param"], response.text


def test_server_keeps_serving_after_bad_structured_requests(server, client):
    for extra, _ in BAD_STRUCTURED:
        httpx.post(server.url("/v1/chat/completions"), json={"messages": USER, **extra}, timeout=60)
    response = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3)
    assert response.usage.completion_tokens == 3
    assert httpx.get(server.url("/health")).status_code == 200
    wait_until(lambda: engine_idle(server.engine), what="engine idle")
