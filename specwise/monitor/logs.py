"""Request logs for `specwise estimate`: one JSON object per line, read as a stream.

Accepted shapes (the first that fits wins; "category" is optional everywhere):
  token ids   {"prompt_token_ids": [...], "completion_token_ids": [...], "max_tokens"?: n}
              exact: nothing is re-tokenized (our engine's RequestOutput gives both lists)
  plain       {"prompt": "...", "completion": "..."}            prompt may also be chat "messages"
  OpenAI      {"request": {"prompt": "..." | "messages": [...], "max_tokens"?: n, "temperature"?: t},
               "response": {"choices": [{"text": "..." | "message": {"content": "..."},
                                         "finish_reason": "..."}]}}
              ("body" is accepted for "request" and for "response", as in OpenAI batch files)
Text is tokenized with the target's tokenizer: a string prompt as the server would
(BOS added), chat messages through its chat template with the generation prompt, the
completion without special tokens. Re-tokenizing text can split a completion differently
from how the server generated it; logs with token ids avoid that.

`specwise evaluate`'s requests.jsonl records carry token counts, not text, so they are
recognised and refused with a message saying what to log instead.

Malformed lines follow evaluate's bad-row policy (bench/inputs/bad_rows.py): an InputError
naming file:line, or with --skip-bad-rows counted and skipped. Lines are read one at a time,
so memory does not grow with the log.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from specwise.bench.inputs.bad_rows import BadRows
from specwise.errors import InputError


@dataclass
class LoggedRequest:
    line: int
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    category: str = "*"
    max_tokens: int | None = None        # the request's limit when logged (the engine drafts up to it)
    temperature: float | None = None


def read_log(path, tokenizer, bad_rows: BadRows, on_bytes: Callable[[int], None] | None = None) \
        -> Iterator[LoggedRequest]:
    """Yield one LoggedRequest per usable line; `on_bytes(n)` reports progress through the file.
    `tokenizer` may be None when every line carries token ids."""
    path = Path(path)
    try:
        file = open(path, "rb")
    except OSError as error:
        raise InputError(f"{path}: cannot read the log ({error.strerror or error})") from None
    with file:
        for number, raw in enumerate(file, start=1):
            if on_bytes:
                on_bytes(len(raw))
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
                yield parse_line(data, number, tokenizer)
            except (json.JSONDecodeError, UnicodeDecodeError):
                bad_rows.reject(path, number, "not valid JSON")
            except InputError as error:            # the whole log is unusable, not this line
                raise InputError(f"{path}:{number}: {error}") from None
            except ValueError as error:
                bad_rows.reject(path, number, str(error))


def parse_line(data, line: int, tokenizer) -> LoggedRequest:
    """One log object -> LoggedRequest; ValueError with a short reason when it fits no shape."""
    if not isinstance(data, dict):
        raise ValueError("a log line must be a JSON object")
    category = str(data.get("category") or "*")
    if "prompt_token_ids" in data or "completion_token_ids" in data:
        return LoggedRequest(line, _ids(data, "prompt_token_ids"), _ids(data, "completion_token_ids"), category,
                             _limit(data.get("max_tokens")), data.get("temperature"))
    if "arm" in data and "load_kind" in data and "output_tokens" in data:
        raise InputError("this is a `specwise evaluate` requests.jsonl: it records token counts, not the text; "
                         "log prompts and completions (see docs/monitor.md for the shapes estimate reads)")
    request = data.get("request", data.get("body")) if "response" in data else None
    if request is not None:
        return _openai(request, data["response"], line, category, tokenizer)
    if "completion" in data and ("prompt" in data or "messages" in data):
        prompt = data.get("prompt", data.get("messages"))
        return LoggedRequest(line, _prompt_ids(prompt, tokenizer), _text_ids(data["completion"], tokenizer),
                             category, _limit(data.get("max_tokens")), data.get("temperature"))
    raise ValueError("not a request log line: need prompt_token_ids + completion_token_ids, prompt + completion, "
                     "or request + response")


def _openai(request, response, line: int, category: str, tokenizer) -> LoggedRequest:
    if not isinstance(request, dict) or not isinstance(response, dict):
        raise ValueError("request and response must be JSON objects")
    response = response.get("body", response) if "choices" not in response else response
    choices = response.get("choices")
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise ValueError("the response has no choices")
    choice = choices[0]
    text = choice.get("text")
    if text is None and isinstance(choice.get("message"), dict):
        text = choice["message"].get("content")
    if not isinstance(text, str):
        raise ValueError("the response's first choice has no text (or message content)")
    prompt = request.get("prompt", request.get("messages"))
    if prompt is None:
        raise ValueError("the request has no prompt or messages")
    limit = request.get("max_completion_tokens", request.get("max_tokens"))
    category = str(request.get("category") or category)
    return LoggedRequest(line, _prompt_ids(prompt, tokenizer), _text_ids(text, tokenizer), category, _limit(limit),
                         request.get("temperature"))


def _prompt_ids(prompt, tokenizer) -> list[int]:
    _need(tokenizer)
    if isinstance(prompt, str) and prompt:
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "content" in m for m in prompt):
        return tokenizer.apply_chat_template(prompt)
    raise ValueError("the prompt must be a non-empty string or a list of chat messages")


def _text_ids(text, tokenizer) -> list[int]:
    _need(tokenizer)
    if not isinstance(text, str):
        raise ValueError("the completion must be a string")
    return tokenizer.encode(text, add_special_tokens=False)


def _ids(data: dict, key: str) -> list[int]:
    ids = data.get(key)
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError(f"{key} must be a list of token ids (non-negative integers)")
    if key == "prompt_token_ids" and not ids:
        raise ValueError("prompt_token_ids is empty")
    return ids


def _limit(value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_tokens must be a positive integer, got {value!r}")
    return value


def _need(tokenizer) -> None:
    if tokenizer is None:
        raise InputError("this log has text, so estimate needs the target's tokenizer: give --target MODEL")
