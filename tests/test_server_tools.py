"""Tools: tool_choice "auto" on a model whose chat template knows no tools (the tiny model's, and
SmolLM2's), and tool calls streamed as OpenAI streams them.

  - the tools go into the system prompt in the documented format; assistant tool calls and tool
    results become text (tool_prompt.py); a template that reads `tools` renders them itself;
  - the output is read back as OpenAI tool calls when it is a <tool_call> block (or a list in one,
    an unclosed last one, a fenced or bare JSON object naming a tool), else it stays plain text;
  - over HTTP, with the output forced through guided_regex: tool_calls and finish_reason
    "tool_calls", streamed and not; plain text otherwise;
  - the default model (integration) does the same through its real tokenizer;
  - required / named tool calls stream incrementally: a call's first delta carries its id, type and
    name, then argument fragments; the openai client's stream accumulation gives the calls of the
    non-streamed answer (the same arguments text), and a required output cut anywhere reads as
    calls whose arguments are prefixes of the final ones.
"""

import json

import openai
import pytest
from test_server_harness import MODEL, TOOLS_ENGINE, ServerThread, serve, tiny_engine
from tiny_models import byte_tokenizer

from specwise.config import EngineConfig
from specwise.engine.llm_engine import LLMEngine
from specwise.server import tool_prompt
from specwise.server.config import ServerConfig
from specwise.server.tool_stream import ToolCallStream, scan_calls
from specwise.server.tools import resolve

WEATHER = {"type": "function", "function": {"name": "weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>'


def test_tools_go_into_the_system_prompt_and_calls_and_results_become_text():
    rendered = tool_prompt.as_text(ASK, TOOLS)
    assert [m["role"] for m in rendered] == ["system", "user"]
    system = rendered[0]["content"]
    lines = system.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(line) for line in lines] == [
        {"name": "weather", "description": "Weather in a city", "parameters": WEATHER["function"]["parameters"]},
        {"name": "time", "parameters": TIME["function"]["parameters"]}]
    assert "<tool_call>" in system and "plain text" in system
    conversation = [{"role": "system", "content": "Be brief."}, *ASK,
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "weather",
                                                                     "arguments": '{"city": "Paris"}'}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    rendered = tool_prompt.as_text(conversation, TOOLS)
    assert rendered[0]["content"].startswith("Be brief.\n\nYou can use these tools")
    assert rendered[2] == {"role": "assistant", "content": CALL}
    assert rendered[3] == {"role": "user", "content": "<tool_response>sunny</tool_response>"}
    assert tool_prompt.as_text(ASK, None) == ASK


def test_only_a_template_that_reads_tools_renders_them_itself():
    tokenizer = byte_tokenizer()
    assert not tokenizer.template_takes_tools
    tokenizer.chat_template = "{% if tools %}T{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert tokenizer.template_takes_tools


AUTO_CASES = {
    CALL: [("weather", {"city": "Paris"})],
    'Let me check.\n' + CALL: [("weather", {"city": "Paris"})],
    '<tool_call>[{"name": "weather", "arguments": {"city": "Rome"}}, {"name": "time", "arguments": {"zone": "UTC"}}]'
    '</tool_call>': [("weather", {"city": "Rome"}), ("time", {"zone": "UTC"})],
    '<tool_call>{"name": "time", "arguments": {"zone": "CET"}}': [("time", {"zone": "CET"})],      # left open
    '```json\n{"name": "time", "arguments": {"zone": "UTC"}}\n```': [("time", {"zone": "UTC"})],
    '{"name": "weather", "parameters": {"city": "Oslo"}}': [("weather", {"city": "Oslo"})],
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>': None,
    '<tool_call>[]</tool_call>': None,
    '{"city": "Paris"}': None,
    "It is sunny.": None,
}


@pytest.mark.parametrize("text", list(AUTO_CASES))
def test_auto_reads_tool_calls_or_leaves_plain_text(text):
    calls, content = resolve(TOOLS, "auto", None).calls(text)
    expected = AUTO_CASES[text]
    if expected is None:
        assert calls is None and content == text
        return
    assert [(call["function"]["name"], json.loads(call["function"]["arguments"])) for call in calls] == expected
    assert all(call["id"].startswith("call_") and call["type"] == "function" for call in calls)
    assert content == ("Let me check." if text.startswith("Let") else None)


def regex_for(text: str) -> str:
    return "".join("\\" + c if c in "\\.^$|?*+()[]{}" else c for c in text)


@pytest.fixture(scope="module")
def server():
    with serve(tiny_engine(**TOOLS_ENGINE)) as running:
        yield running


def chat(server, stream: bool, **kwargs) -> dict:
    """One chat request; a streamed answer is folded into the non-streamed shape."""
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=120)
    if not stream:
        return client.chat.completions.create(model=MODEL, **kwargs).model_dump()["choices"][0]
    message, finish = {"content": "", "tool_calls": []}, None
    for chunk in client.chat.completions.create(model=MODEL, stream=True, **kwargs):
        for choice in chunk.choices:
            message["content"] += choice.delta.content or ""
            message["tool_calls"] += [call.model_dump() for call in choice.delta.tool_calls or []]
            finish = choice.finish_reason or finish
    return {"message": {"content": message["content"] or None, "tool_calls": message["tool_calls"] or None},
            "finish_reason": finish}


@pytest.mark.parametrize("stream", [False, True])
def test_auto_over_http_gives_tool_calls_or_text(server, stream):
    choice = chat(server, stream, messages=ASK, tools=TOOLS, max_tokens=80, temperature=0,
                  extra_body={"guided_regex": regex_for(CALL)})
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "weather" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert call["id"].startswith("call_") and choice["message"]["content"] is None
    choice = chat(server, stream, messages=ASK, tools=TOOLS, max_tokens=20, temperature=0,
                  extra_body={"guided_regex": "It is sunny\\."})
    assert choice["message"]["content"] == "It is sunny." and not choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "stop"


def test_the_prompt_the_model_sees_has_the_tools(server):
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=120)
    response = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=1)
    expected = server.engine.tokenizer.apply_chat_template(tool_prompt.as_text(ASK, TOOLS))
    assert response.usage.prompt_tokens == len(expected)
    none = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=1)
    assert none.usage.prompt_tokens == len(server.engine.tokenizer.apply_chat_template(ASK))


@pytest.mark.integration
def test_default_model_calls_a_tool_in_the_documented_format():
    """SmolLM2-135M's template knows no tools: the tools reach it in the system prompt. A 135M model
    seldom decides to call one, so the call's shape is forced (the city is the model's choice)."""
    engine = LLMEngine(EngineConfig(max_model_len=1024, speculative="ngram", num_threads=1))
    assert not engine.tokenizer.template_takes_tools
    running = ServerThread(engine, ServerConfig(served_model_name=MODEL)).start()
    try:
        ask = [{"role": "user", "content": "What is the weather in Paris? Use the weather tool."}]
        shape = regex_for('<tool_call>{"name": "weather", "arguments": {"city": "') + '[A-Za-z ]{1,20}' + \
            regex_for('"}}</tool_call>')
        for stream in (False, True):
            choice = chat(running, stream, messages=ask, tools=TOOLS, max_tokens=60, temperature=0,
                          extra_body={"guided_regex": shape})
            assert choice["finish_reason"] == "tool_calls"
            [call] = choice["message"]["tool_calls"]
            assert call["function"]["name"] == "weather"
            assert set(json.loads(call["function"]["arguments"])) == {"city"}
        free = chat(running, False, messages=ask, tools=TOOLS, max_tokens=40, temperature=0)
        if free["message"]["tool_calls"]:
            assert free["finish_reason"] == "tool_calls"
            assert all(call["function"]["name"] in ("weather", "time") for call in free["message"]["tool_calls"])
        else:
            assert free["message"]["content"] and free["finish_reason"] in ("stop", "length")
    finally:
        running.stop()


REQUIRED_OUTPUTS = [
    '[{"name": "weather", "parameters": {"city": "Pa\\"ris}"}}, {"name": "time", "parameters": {"zone": "UTC"}}]',
    '[\n  {\n    "parameters": {"n": 12, "ok": true, "xs": [1, {"a": null}]},\n    "name": "weather"\n  }\n]',
    '[{"name": "time", "parameters": 7}]',
]


@pytest.mark.parametrize("text", REQUIRED_OUTPUTS)
def test_required_output_cut_anywhere_reads_as_growing_calls(text):
    final, closed = scan_calls(text)
    assert closed and all(call.done for call in final)
    expected = [(call["name"], json.dumps(call["parameters"])) for call in json.loads(text)]
    assert [(call.name, json.dumps(json.loads(call.arguments))) for call in final] == expected
    stream, fragments = ToolCallStream(None), {}
    for end in range(len(text) + 1):
        calls, closed = scan_calls(text[:end])
        assert closed == (end == len(text))
        for call, done in zip(calls, final):
            assert done.arguments.startswith(call.arguments) and call.name in (None, done.name)
        for delta in stream.feed(text[end - 1:end] if end else ""):      # one character per step
            entry = fragments.setdefault(delta["index"], {"name": None, "arguments": ""})
            entry["name"] = delta["function"].get("name") or entry["name"]
            entry["arguments"] += delta["function"]["arguments"]
    assert [(entry["name"], entry["arguments"]) for _, entry in sorted(fragments.items())] == \
        [(call.name, call.arguments) for call in final]
    calls, content = resolve(TOOLS, "required", None).calls(text)
    assert [call["function"]["arguments"] for call in calls] == [call.arguments for call in final] and content is None


BOUNDED_TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer",
                                                                                        "minimum": 1, "maximum": 9}},
    "required": ["city", "days"], "additionalProperties": False}}},
                 {"type": "function", "function": {"name": "time", "parameters": {
                     "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
                     "additionalProperties": False}}}]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "time"}}])
def test_streamed_tool_calls_arrive_in_fragments_and_add_up(server, tool_choice):
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=120)
    kwargs = dict(model=MODEL, messages=ASK, tools=BOUNDED_TOOLS, tool_choice=tool_choice, max_tokens=200,
                  temperature=0, parallel_tool_calls=False)     # a random model would not stop adding calls
    whole = client.chat.completions.create(**kwargs).choices[0]
    with client.chat.completions.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_completion().choices[0]
    assert whole.finish_reason == final.finish_reason == "tool_calls"
    assert [(call.function.name, call.function.arguments) for call in final.message.tool_calls] == \
        [(call.function.name, call.function.arguments) for call in whole.message.tool_calls]
    assert all(call.id.startswith("call_") and call.type == "function" for call in final.message.tool_calls)
    fragments = [event for event in events if event.type == "tool_calls.function.arguments.delta"]
    assert len(fragments) > len(final.message.tool_calls), "arguments arrive in several fragments"
    for call in final.message.tool_calls:
        json.loads(call.function.arguments)
    if isinstance(tool_choice, dict):
        assert [call.function.name for call in final.message.tool_calls] == ["time"]
