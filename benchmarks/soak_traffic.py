"""What soak.py sends: the request kinds of each arm's mix, malformed requests, and a client killed mid-stream.

Every request is bounded (max_tokens <= 48, n <= 2). A kind is (route, body, how the client reads it):
"stream" reads server-sent events to [DONE] and times TTFT / TPOT, "hang-up" closes the stream after its
first chunks (a client disconnecting), "whole" reads one JSON body. Malformed requests must be answered
4xx, never 5xx, never dropped.
"""

import json
import random

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                      "days": {"type": "array", "items": {"enum": ["mon", "tue", "wed"]},
                                               "maxItems": 3}},
     "required": ["city", "days"], "additionalProperties": False},
]
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Current weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string", "maxLength": 20}},
                                                          "required": ["city"]}}}]
PROMPTS = ["Write a short story about a lighthouse keeper.", "Explain how a bicycle works, step by step.",
           "List five facts about the moon.", "Summarise the plot of Romeo and Juliet.",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
           "Translate to French: the cat sits on the mat, and the dog sleeps by the door."]

# kind -> weight, per arm: suffix is mostly free text (its cache learns from responses); ngram-structured
# is mostly grammars (drafts cut to the grammar, forced tokens)
MIXES = {
    "suffix": {"chat-stream": 4, "completion-stream": 2, "completion": 2, "chat-n2": 1, "json-schema": 1,
               "tool-required": 1, "hang-up": 1},
    "ngram-structured": {"chat-stream": 1, "completion": 1, "chat-n2": 1, "json-schema": 3, "json-object": 1,
                         "tool-required": 2, "guided-choice": 1, "hang-up": 1},
}
ARM_FLAGS = {"suffix": ["--speculative", "suffix"], "ngram-structured": ["--speculative", "ngram"]}


def request(kind: str, rng: random.Random, model: str) -> tuple[str, dict, str]:
    """(route, body, read) of one request of this kind."""
    prompt = rng.choice(PROMPTS)
    chat = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": rng.randint(16, 48),
            "temperature": 0.0}
    completion = {"model": model, "prompt": prompt, "max_tokens": rng.randint(16, 48), "temperature": 0.0}
    streamed = {"stream": True, "stream_options": {"include_usage": True}}
    if kind == "chat-stream":
        return "/v1/chat/completions", {**chat, **streamed}, "stream"
    if kind == "completion-stream":
        return "/v1/completions", {**completion, **streamed}, "stream"
    if kind == "completion":
        return "/v1/completions", completion, "whole"
    if kind == "short":                 # the bursts'
        return "/v1/completions", {**completion, "max_tokens": 8}, "whole"
    if kind == "chat-n2":
        return "/v1/chat/completions", {**chat, "n": 2, "temperature": 0.8, "seed": rng.randrange(1000)}, "whole"
    if kind == "json-schema":
        schema = rng.choice(SCHEMAS)
        return "/v1/chat/completions", {**chat, **streamed, "response_format": {
            "type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}}, "stream"
    if kind == "json-object":
        return "/v1/chat/completions", {**chat, "response_format": {"type": "json_object"}}, "whole"
    if kind == "tool-required":
        return "/v1/chat/completions", {**chat, **streamed, "tools": TOOLS, "tool_choice": "required"}, "stream"
    if kind == "guided-choice":
        return "/v1/chat/completions", {**chat, "guided_choice": ["yes", "no", "maybe"]}, "whole"
    if kind == "hang-up":
        return "/v1/chat/completions", {**chat, **streamed, "max_tokens": 48}, "hang-up"
    raise ValueError(f"unknown kind {kind!r}")


def malformed(rng: random.Random, model: str) -> tuple[str, bytes]:
    """(route, raw body) of a request the server must refuse with a 4xx."""
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    bodies = [
        b'{"model": "x", "messages": [',                                               # broken JSON
        json.dumps({**chat, "response_format": {"type": "json_schema",
                                                "json_schema": {"schema": {"type": "nonsense"}}}}).encode(),
        json.dumps({**chat, "tools": TOOLS, "tool_choice": {"type": "function",
                                                            "function": {"name": "unknown"}}}).encode(),
        json.dumps({**chat, "n": 1_000_000}).encode(),
        json.dumps({**chat, "max_tokens": -5}).encode(),
        json.dumps({**chat, "temperature": "hot"}).encode(),
        json.dumps({**chat, "model": "no-such-model"}).encode(),
        json.dumps({"model": model, "messages": []}).encode(),
        json.dumps({"model": model, "prompt": "x" * 40_000, "max_tokens": 8}).encode(),   # over the context
        json.dumps({**chat, "guided_regex": "(unclosed"}).encode(),
    ]
    body = rng.choice(bodies)
    return ("/v1/completions" if b'"prompt"' in body else "/v1/chat/completions"), body


# A client process that starts a stream, says so on stdout, and reads until it is SIGKILLed (by PID).
KILLED_CLIENT = r"""
import http.client, json, sys
port, model = int(sys.argv[1]), sys.argv[2]
body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Tell me a long story."}],
                   "max_tokens": 48, "stream": True})
connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
response = connection.getresponse()
print(response.status, flush=True)
while response.read1(1024):
    pass
"""
