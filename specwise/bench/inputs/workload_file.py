"""User workload files: JSONL, one request per line.

    {"prompt": "Summarize: ...", "max_tokens": 200, "category": "rag", "timestamp": 12.5}
    {"messages": [{"role": "user", "content": "Hi"}], "category": "chat"}

`prompt` or `messages` is required; `max_tokens`, `category`, `timestamp` (seconds;
replayed relative to the earliest one) and `id` are optional. Other keys are kept in
`extra`. The built-in suite's data files use this same format.
"""

from pathlib import Path

from specwise.bench.inputs.bad_rows import BadRows, parse_int, read_jsonl
from specwise.bench.inputs.request import WorkloadRequest
from specwise.errors import InputError

ROLES = ("system", "user", "assistant")
_KNOWN_KEYS = {"prompt", "messages", "max_tokens", "category", "timestamp", "id"}


def read_workload(path, skip_bad_rows: bool = False, default_category: str = "custom",
                  default_max_tokens: int = 128, bad_rows: BadRows | None = None) -> list[WorkloadRequest]:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such workload file")
    bad_rows = bad_rows if bad_rows is not None else BadRows(skip=skip_bad_rows)
    bad_rows.skip = bad_rows.skip or skip_bad_rows
    requests = read_jsonl(path, bad_rows, lambda data, line_number: _request(
        data, f"{path.stem}:{line_number}", default_category, default_max_tokens))
    bad_rows.warn_if_any(path)
    if not requests:
        raise InputError(f"{path}: no requests in this workload file")
    _relative_arrivals(requests, path)
    return requests


def _request(data, fallback_id: str, default_category: str, default_max_tokens: int) -> WorkloadRequest:
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object with 'prompt' or 'messages'")
    prompt, messages = data.get("prompt"), data.get("messages")
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of 'prompt' (a string) or 'messages' (a list)")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        raise ValueError("'prompt' must be a non-empty string")
    if messages is not None:
        _check_messages(messages)
    category = data.get("category", default_category)
    if not isinstance(category, str) or not category:
        raise ValueError("'category' must be a non-empty string")
    timestamp = data.get("timestamp")
    if timestamp is not None and (isinstance(timestamp, bool) or not isinstance(timestamp, (int, float))
                                  or timestamp < 0):
        raise ValueError(f"'timestamp' must be a number of seconds >= 0, got {timestamp!r}")
    return WorkloadRequest(
        request_id=str(data.get("id", fallback_id)), category=category, prompt=prompt, messages=messages,
        max_tokens=parse_int(data.get("max_tokens", default_max_tokens), "max_tokens", 1),
        arrival_time=None if timestamp is None else float(timestamp),
        extra={k: v for k, v in data.items() if k not in _KNOWN_KEYS})


def _check_messages(messages) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of {role, content} objects")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise ValueError(f"messages[{index}] must be an object with a string 'content'")
        if message.get("role") not in ROLES:
            raise ValueError(f"messages[{index}].role must be one of {', '.join(ROLES)}, "
                             f"got {message.get('role')!r}")


def _relative_arrivals(requests: list[WorkloadRequest], path: Path) -> None:
    stamped = [r.arrival_time for r in requests if r.arrival_time is not None]
    if not stamped:
        return
    if len(stamped) != len(requests):
        raise InputError(f"{path}: some lines have a 'timestamp' and some do not; give it on all or none")
    start = min(stamped)
    for request in requests:
        request.arrival_time -= start
