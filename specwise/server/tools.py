"""Tools: which grammar a tool_choice asks for, and the OpenAI `tool_calls` parsed from the output.

  tool_choice "none"       the tools are not shown to the model, the output is plain text.
  tool_choice "auto"       (the default with tools) unconstrained; the output becomes tool calls
                           when it is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
                           blocks (the Hermes / Qwen format; a block may hold a JSON list of
                           calls, and the last may be left unclosed), or one such JSON object
                           alone (bare or in a ```json fence), naming a tool; otherwise it is
                           plain text. Templates without tool support are told this format in
                           the system prompt (tool_prompt.py).
  tool_choice "required"   the output must be a JSON array of calls
                           [{"name": <a tool>, "parameters": {...its schema...}}, ...] (one call
                           when parallel_tool_calls is false), as vLLM does.
  tool_choice {"type": "function", "function": {"name": N}}
                           the output must be N's arguments (its parameters schema).

A message with tool calls has finish_reason "tool_calls" and each call is
{"id": "call_...", "type": "function", "function": {"name": N, "arguments": "<JSON text>"}}.
Streamed, required and named calls go out as deltas while the output grows (tool_stream.py);
"auto" sends its message whole in the last chunk (text or calls is known only at the end).
"""

import json
import re
import uuid
from dataclasses import dataclass

from specwise.sampling_params import StructuredOutput
from specwise.server.errors import APIError
from specwise.server.tool_stream import scan_calls

TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)   # the last may be open
FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
ANY_OBJECT = {"type": "object"}


@dataclass
class ToolChoice:
    mode: str                              # none | auto | required | named
    functions: dict[str, dict]             # name -> the tool's "function" object
    name: str | None = None                # the named tool
    parallel: bool = True

    @property
    def grammar(self) -> StructuredOutput | None:
        if self.mode == "named":
            return StructuredOutput("json", json.dumps(self.functions[self.name].get("parameters") or ANY_OBJECT))
        if self.mode != "required":
            return None
        calls = [{"type": "object", "properties": {"name": {"const": name},
                                                   "parameters": function.get("parameters") or ANY_OBJECT},
                  "required": ["name", "parameters"], "additionalProperties": False}
                 for name, function in self.functions.items()]
        schema = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
        if not self.parallel:
            schema["maxItems"] = 1
        return StructuredOutput("json", json.dumps(schema))

    def calls(self, text: str) -> tuple[list[dict] | None, str | None]:
        """(tool_calls or None, the content left): the output read as this choice says."""
        if self.mode == "named":
            return [tool_call(self.name, text)], None
        if self.mode == "required":
            calls, closed = scan_calls(text)    # arguments: the raw text, as streamed (tool_stream.py)
            if not closed or not calls or not all(call.done and call.name for call in calls):
                return None, text               # cut short (max_tokens): hand back the text
            return [tool_call(call.name, call.arguments) for call in calls], None
        if self.mode == "auto":
            return self._auto(text)
        return None, text

    def _auto(self, text: str) -> tuple[list[dict] | None, str | None]:
        blocks = TOOL_CALL_BLOCK.findall(text)
        fenced = FENCE.match(text.strip())
        candidates = blocks or [fenced.group(1) if fenced else text.strip()]
        calls = []
        for block in candidates:
            try:
                parsed = json.loads(block)
            except json.JSONDecodeError:
                return None, text
            for call in parsed if isinstance(parsed, list) else [parsed]:     # a block may hold a list of calls
                if not isinstance(call, dict) or call.get("name") not in self.functions:
                    return None, text
                arguments = call.get("arguments", call.get("parameters", {}))
                calls.append(tool_call(call["name"],
                                       arguments if isinstance(arguments, str) else json.dumps(arguments)))
        if not calls:
            return None, text
        content = TOOL_CALL_BLOCK.sub("", text).strip() if blocks else ""
        return calls, content or None


def tool_call(name: str, arguments: str) -> dict:
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": name, "arguments": arguments}}


def resolve(tools: list[dict] | None, tool_choice, parallel: bool | None) -> ToolChoice | None:
    """The request's ToolChoice (None without tools); 400s name what is malformed."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise APIError(400, "tool_choice needs tools", "tool_choice", "invalid_value")
        return None
    functions = {}
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type") != "function" or not isinstance(function, dict) or \
                not isinstance(function.get("name"), str) or not function["name"]:
            raise APIError(400, "a tool is {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": "
                                "{...}}}", f"tools.{index}", "invalid_value")
        if not isinstance(function.get("parameters", {}), dict):
            raise APIError(400, "parameters must be a JSON schema object", f"tools.{index}.function.parameters",
                           "invalid_value")
        functions[function["name"]] = function
    parallel = parallel is not False
    if tool_choice is None or tool_choice in ("none", "auto", "required"):
        return ToolChoice(tool_choice or "auto", functions, parallel=parallel)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        if name not in functions:
            raise APIError(400, f"tool_choice names {name!r}, which is not among the tools", "tool_choice",
                           "invalid_value")
        return ToolChoice("named", functions, name, parallel)
    raise APIError(400, "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                        "\"function\": {\"name\": ...}}", "tool_choice", "invalid_value")
