"""Response bodies and stream chunks of the completions and chat APIs, as plain dicts.

Every answer carries a `specwise` object with the request's acceptance figures (the
definitions of `specwise.engine.spec_decode.metrics`): in the body of a non-streamed answer, and in the
stream chunk that carries finish_reason.
"""

import time
import uuid
from abc import ABC, abstractmethod

from specwise.engine.outputs import RequestOutput
from specwise.engine.spec_decode.metrics import SpecStats


def usage(output: RequestOutput) -> dict:
    prompt, completion = len(output.prompt_token_ids), len(output.output_token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def acceptance(speculative: bool, spec: SpecStats) -> dict:
    """Did this request draft, and how much of it was accepted."""
    return {"speculative": speculative, "drafts": spec.drafts, "draft_tokens": spec.draft_tokens,
            "accepted_tokens": spec.accepted_tokens, "accepted_per_position": list(spec.accepted_per_position),
            "acceptance_rate": spec.acceptance_rate, "mean_acceptance_length": spec.mean_acceptance_length}


class Responder(ABC):
    """Builds the bodies of one request's answer; subclasses name the object types and choice shape."""

    id_prefix = ""
    object_name = ""
    chunk_object_name = ""

    def __init__(self, model: str, speculative: bool, include_usage: bool = False):
        self.id = self.id_prefix + uuid.uuid4().hex
        self.model = model
        self.created = int(time.time())
        self.speculative = speculative
        self.include_usage = include_usage

    def body(self, output: RequestOutput) -> dict:
        choice = {"index": 0, **self.full_choice(output.text), "logprobs": None,
                  "finish_reason": output.finish_reason}
        return {**self._header(self.object_name), "choices": [choice], "usage": usage(output),
                "specwise": acceptance(self.speculative, output.spec)}

    def opening_chunks(self) -> list[dict]:
        return []

    def chunk(self, output: RequestOutput) -> dict:
        choice = {"index": 0, **self.delta_choice(output.new_text, output.finished), "logprobs": None,
                  "finish_reason": output.finish_reason if output.finished else None}
        payload = {**self._header(self.chunk_object_name), "choices": [choice]}
        if self.include_usage:
            payload["usage"] = None
        if output.finished:
            payload["specwise"] = acceptance(self.speculative, output.spec)
        return payload

    def usage_chunk(self, output: RequestOutput) -> dict:
        return {**self._header(self.chunk_object_name), "choices": [], "usage": usage(output)}

    @abstractmethod
    def full_choice(self, text: str) -> dict:
        """The choice fields of a non-streamed answer, besides index, logprobs and finish_reason."""

    @abstractmethod
    def delta_choice(self, text: str, finished: bool) -> dict:
        """The choice fields of one stream chunk, besides index, logprobs and finish_reason."""

    def _header(self, object_name: str) -> dict:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model}


class CompletionResponder(Responder):
    id_prefix = "cmpl-"
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def full_choice(self, text: str) -> dict:
        return {"text": text}

    def delta_choice(self, text: str, finished: bool) -> dict:
        return {"text": text}


class ChatResponder(Responder):
    id_prefix = "chatcmpl-"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def full_choice(self, text: str) -> dict:
        return {"message": {"role": "assistant", "content": text}}

    def opening_chunks(self) -> list[dict]:
        payload = {**self._header(self.chunk_object_name),
                   "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}]}
        if self.include_usage:
            payload["usage"] = None
        return [payload]

    def delta_choice(self, text: str, finished: bool) -> dict:
        return {"delta": {"content": text} if text or not finished else {}}
