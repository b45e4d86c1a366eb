"""Prompts of a given token length for trace replay, cut from a suite category's text.

With a tokenizer the category text is encoded once and each prompt is a window of
exactly `prompt_tokens` ids (kept in extra["prompt_token_ids"] so the in-process
engine gets that exact length; endpoints get the decoded text). Without one, the window
is cut by characters at about 4 per token; the server's usage then gives the real count.

Windows start at different offsets per request, so prompts differ from each other but
stay in the chosen category's style (code text for code traces, prose for chat).
"""

import dataclasses
from typing import Protocol

from specwise.bench.inputs.suite import category_text
from specwise.bench.inputs.request import WorkloadRequest

CHARS_PER_TOKEN = 4
_STRIDE = 7919          # a prime: consecutive requests start far apart in the text


class TextTokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


def synthesize_prompts(requests: list[WorkloadRequest], category: str,
                       tokenizer: TextTokenizer | None = None,
                       max_total_tokens: int | None = None, first_window: int = 0) -> list[WorkloadRequest]:
    """Fill in `prompt` for requests that only carry `prompt_tokens`.

    `max_total_tokens` (the target's context length) clips prompt and output so that
    they fit; clipped requests are marked extra["clipped"] = True. Request i takes the text's
    window first_window + i.
    """
    text = category_text(category)
    ids = tokenizer.encode(text, add_special_tokens=False) if tokenizer is not None else None
    synthesized = []
    for index, request in enumerate(requests):
        if request.prompt is not None or request.messages is not None or request.prompt_tokens is None:
            synthesized.append(request)
            continue
        prompt_len, output_len = _fit(request.prompt_tokens, request.max_tokens, max_total_tokens)
        extra = dict(request.extra, category_text=category)
        if (prompt_len, output_len) != (request.prompt_tokens, request.max_tokens):
            extra["clipped"] = True
        start = (first_window + index) * _STRIDE
        if ids is not None:
            window = _cyclic(ids, start, prompt_len)
            extra["prompt_token_ids"] = window
            prompt = tokenizer.decode(window)
        else:
            prompt = "".join(_cyclic(text, start, prompt_len * CHARS_PER_TOKEN))
        synthesized.append(dataclasses.replace(request, prompt=prompt, prompt_tokens=prompt_len,
                                               max_tokens=output_len, extra=extra))
    return synthesized


def _fit(prompt_len: int, output_len: int, limit: int | None) -> tuple[int, int]:
    """Shrink output to at most half the limit, then the prompt to what is left."""
    if limit is None or prompt_len + output_len <= limit:
        return prompt_len, output_len
    output_len = max(1, min(output_len, limit // 2))
    return max(1, min(prompt_len, limit - output_len)), output_len


def _cyclic(items, start: int, length: int) -> list:
    size = len(items)
    return [items[(start + offset) % size] for offset in range(length)]
