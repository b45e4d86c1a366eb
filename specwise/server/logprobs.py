"""Logprobs in the two OpenAI shapes, from the engine's TokenLogprob list.

The values are the target model's: log_softmax of its logits after penalties, logit_bias,
min_tokens and the grammar mask, before temperature / top-k / top-p (vLLM's
`processed_logits` mode; see engine/sampling/logits_processors.py). Under speculation they
are the same numbers plain decoding gives, never the drafter's.

Chat (`logprobs: true, top_logprobs: 2`), one entry per token:
    {"content": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105],
                  "top_logprobs": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105]}, ...]}]}
Completions (`logprobs: 2`):
    {"tokens": ["Hi"], "token_logprobs": [-0.1], "top_logprobs": [{"Hi": -0.1, "Hey": -2.5}],
     "text_offset": [0]}
Completions with `echo: true` put the prompt's tokens first (offsets from 0, the output's from the
end of the echoed prompt); the first prompt token has no logprob (null, as OpenAI and vLLM):
    {"tokens": ["Say", " hi", "!"], "token_logprobs": [null, -3.2, -0.4],
     "top_logprobs": [null, {" hi": -3.2, ...}, {"!": -0.4, ...}], "text_offset": [0, 3, 6]}
Prompt logprobs are the raw log_softmax (no penalty or grammar applies to a prompt).
"""

import math

from specwise.engine.outputs import TokenLogprob
from specwise.models.tokenizer import Tokenizer

FLOOR = -9999.0          # -inf (a token the grammar or min_tokens forbids) as JSON can carry it


def finite(value: float) -> float:
    return value if math.isfinite(value) else FLOOR


class LogprobFormatter:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def token(self, token_id: int) -> str:
        if token_id not in self.cache:
            self.cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return self.cache[token_id]

    def chat(self, logprobs: list[TokenLogprob]) -> dict:
        def entry(token_id: int, value: float) -> dict:
            text = self.token(token_id)
            return {"token": text, "logprob": finite(value), "bytes": list(text.encode())}
        return {"content": [{**entry(item.token_id, item.logprob),
                             "top_logprobs": [entry(token_id, value) for token_id, value in item.top]}
                            for item in logprobs]}

    def completion(self, logprobs: list[TokenLogprob], text_offset: int = 0,
                   prompt: tuple[list[int], list[TokenLogprob | None]] | None = None) -> dict:
        """logprobs of output tokens from text_offset on; prompt: (token ids, logprobs) to put first (echo)."""
        body = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        if prompt is not None:
            self._extend(body, [self.token(token_id) for token_id in prompt[0]], prompt[1], 0)
        self._extend(body, [self.token(item.token_id) for item in logprobs], logprobs, text_offset)
        return body

    def _extend(self, body: dict, tokens: list[str], logprobs: list[TokenLogprob | None], offset: int) -> None:
        for token, item in zip(tokens, logprobs):
            body["tokens"].append(token)
            body["token_logprobs"].append(None if item is None else finite(item.logprob))
            body["top_logprobs"].append(None if item is None else
                                        {self.token(token_id): finite(value) for token_id, value in item.top})
            body["text_offset"].append(offset)
            offset += len(token)
