"""Tool calls read from a grammar-forced output while it grows (tool_choice "required" or named).

"required": the output is a JSON array [{"name": N, "parameters": {...}}, ...] (tools.py's grammar).
`scan_calls` reads it however far it got: each call's name once its string is closed, and the
raw text of its parameters value so far. That raw text is the call's `arguments`, in the
streamed deltas and in the non-streamed message alike, so the fragments of a call concatenate
to exactly the arguments a non-streamed answer gives.

Named tool_choice: the whole output is the arguments.

`ToolCallStream` turns the growing text into OpenAI's stream deltas:
    {"index": 0, "id": "call_...", "type": "function", "function": {"name": "time", "arguments": ""}}
    {"index": 0, "function": {"arguments": "{\"zone\": \"U"}}
    {"index": 0, "function": {"arguments": "TC\"}"}}
    {"index": 1, "id": "call_...", "type": "function", "function": {"name": "weather", "arguments": "{"}}
A call's first delta goes out once its name is known; calls go out in order.
"""

import json
import uuid
from dataclasses import dataclass

WHITESPACE = " \t\n\r"


@dataclass
class PartialCall:
    name: str | None = None          # None until the name's string is closed
    arguments: str = ""              # the raw text of "parameters" so far
    done: bool = False               # the call's object is closed


def scan_calls(text: str) -> tuple[list[PartialCall], bool]:
    """The calls of a JSON array of {"name", "parameters"} objects cut anywhere; and whether it closed.

    Worked example: '[{"name": "time", "parameters": {"zone": "U' ->
    ([PartialCall("time", '{"zone": "U', False)], False)."""
    calls: list[PartialCall] = []
    i = skip_whitespace(text, 0)
    if not text[i:i + 1] == "[":
        return calls, False
    i += 1
    while True:
        i = skip_whitespace(text, i)
        if i >= len(text) or text[i] not in "],{":
            return calls, False
        if text[i] == "]":
            return calls, True
        if text[i] == ",":
            i += 1
            continue
        call = PartialCall()
        calls.append(call)
        i = scan_object(text, i + 1, call)
        if i is None:
            return calls, False


def scan_object(text: str, i: int, call: PartialCall) -> int | None:
    """Read one call's members from just after its "{"; the index after its "}", or None when cut."""
    while True:
        i = skip_whitespace(text, i)
        if i >= len(text):
            return None
        if text[i] == "}":
            call.done = True
            return i + 1
        if text[i] == ",":
            i += 1
            continue
        end = value_end(text, i)
        if end is None or text[i] != '"':
            return None
        key = json.loads(text[i:end])
        i = skip_whitespace(text, end)
        if text[i:i + 1] != ":":
            return None
        i = skip_whitespace(text, i + 1)
        end = value_end(text, i)
        if key == "parameters":
            call.arguments = text[i:len(text) if end is None else end]
        if end is None:
            return None
        if key == "name":
            call.name = json.loads(text[i:end])
        i = end


def skip_whitespace(text: str, i: int) -> int:
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    return i


def value_end(text: str, i: int) -> int | None:
    """The index just after the JSON value starting at i, or None when the text ends inside it."""
    if i >= len(text):
        return None
    depth, in_string, escaped = 0, False, False
    for j in range(i, len(text)):
        char = text[j]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
                if depth == 0:
                    return j + 1
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth <= 0:
                return j + 1 if depth == 0 else j        # depth < 0: a scalar ended by its container
        elif depth == 0 and char in ", \t\n\r":
            return j                                     # a number, true, false or null ended
    return None


class ToolCallStream:
    """The tool_calls deltas of one choice, fed the text released by each step."""

    def __init__(self, named: str | None):
        self.named = named               # the tool of a named tool_choice; None for "required"
        self.text = ""
        self.sent: list[int] = []        # per call: characters of its arguments sent

    def calls(self) -> list[PartialCall]:
        if self.named is not None:
            return [PartialCall(self.named, self.text)]
        return scan_calls(self.text)[0]

    def feed(self, new_text: str) -> list[dict]:
        self.text += new_text
        deltas = []
        for index, call in enumerate(self.calls()):
            if call.name is None:
                break
            if index == len(self.sent):
                deltas.append({"index": index, "id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                               "function": {"name": call.name, "arguments": call.arguments}})
                self.sent.append(len(call.arguments))
            elif len(call.arguments) > self.sent[index]:
                deltas.append({"index": index, "function": {"arguments": call.arguments[self.sent[index]:]}})
                self.sent[index] = len(call.arguments)
        return deltas

    @property
    def started(self) -> bool:
        return bool(self.sent)
