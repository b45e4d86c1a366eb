"""Tools for chat templates that do not render them (SmolLM2, the default model): `as_text(messages, tools)`.

A template that reads a `tools` variable (Llama 3.1, Qwen2.5, Hermes, Mistral) gets the tools and
the messages as they are. For any other template the messages are rewritten before rendering:

  - the tools go into the system prompt (after the first system message's text, or as a new
    system message first), one JSON line per tool, with how to call them (TOOLS_PROMPT);
  - an assistant message's tool_calls become its text, one block per call:
        <tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>
  - a tool message becomes a user message: <tool_response>{the tool's output}</tool_response>.

Worked example: tools [weather(city)], messages [user "Weather in Paris?"] ->
    [system "You can use these tools ...\n<tools>\n{"name": "weather", ...}\n</tools>\n...",
     user "Weather in Paris?"]
and a reply `<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>` is read back
as one OpenAI tool call by `tools.py` (tool_choice "auto").
"""

import json

TOOLS_PROMPT = """You can use these tools. Each line below is one tool: its name, what it does, and the JSON \
schema of its arguments.
<tools>
{tools}
</tools>
To use a tool, reply with only this, once for each call:
<tool_call>{{"name": "<the tool's name>", "arguments": {{<its arguments as JSON>}}}}</tool_call>
Tool results come back as <tool_response>...</tool_response>. When no tool is needed, reply in plain text."""


def tools_prompt(tools: list[dict]) -> str:
    lines = []
    for tool in tools:
        function = tool["function"]
        line = {"name": function["name"]}
        if function.get("description"):
            line["description"] = function["description"]
        line["parameters"] = function.get("parameters") or {"type": "object"}
        lines.append(json.dumps(line, ensure_ascii=False))
    return TOOLS_PROMPT.format(tools="\n".join(lines))


def call_block(call: dict) -> str:
    """One OpenAI tool call (arguments as a JSON string or an object) as a <tool_call> block."""
    function = call.get("function", {})
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    return "<tool_call>" + json.dumps({"name": function.get("name"), "arguments": arguments},
                                      ensure_ascii=False) + "</tool_call>"


def as_text(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """The messages (as chat templates take them) with tools, tool calls and tool results as text."""
    rewritten = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            blocks = "\n".join(call_block(call) for call in message.pop("tool_calls"))
            message["content"] = (message.get("content") or "") + ("\n" if message.get("content") else "") + blocks
        if message["role"] == "tool":
            message = {"role": "user", "content": f"<tool_response>{message.get('content') or ''}</tool_response>"}
        message.pop("tool_call_id", None)
        rewritten.append(message)
    if tools:
        prompt = tools_prompt(tools)
        if rewritten and rewritten[0]["role"] == "system":
            rewritten[0] = {**rewritten[0], "content": (rewritten[0]["content"] + "\n\n" + prompt).lstrip()}
        else:
            rewritten.insert(0, {"role": "system", "content": prompt})
    return rewritten
