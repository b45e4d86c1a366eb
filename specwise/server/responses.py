"""Response bodies and stream chunks of the completions and chat APIs, as plain dicts.

A request with n choices has one engine request per choice; `body` gets each choice's final
output and all its logprobs, `chunk` one choice's step. With best_of > n (completions, not
streamed) there is one engine request per candidate and `body` answers with the n whose tokens
have the highest cumulative logprob, best first (as vLLM did). Usage counts the prompt once and
the completion tokens of every choice, and of every candidate (all were generated, as OpenAI
bills them). With `stream_options.continuous_usage_stats` every chunk
carries the usage so far; with `include_usage` a last chunk (no choices) carries the total.

Every answer carries a `specwise` object with the request's acceptance figures (the
definitions of `specwise.engine.spec_decode.metrics`): in the body of a non-streamed answer,
and in the stream chunk that carries a choice's finish_reason.

Chat requests with tool_choice "required" or named stream their tool calls as OpenAI does (a
call's first delta has its id, type and name, then argument fragments: tool_stream.py); with
"auto" the message comes whole, in the chunk that finishes it: whether the output is text or
tool calls is known only then.
"""

import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass

from specwise.engine.outputs import RequestOutput, TokenLogprob
from specwise.engine.spec_decode.metrics import SpecStats
from specwise.server.logprobs import LogprobFormatter
from specwise.server.tool_stream import ToolCallStream
from specwise.server.tools import ToolChoice


@dataclass
class Finished:
    output: RequestOutput
    logprobs: list[TokenLogprob] | None
    prompt_logprobs: list[TokenLogprob | None] | None = None      # echo with logprobs
    cumulative_logprob: float = 0.0                                 # best_of's ranking


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def acceptance(speculative: bool, spec: SpecStats) -> dict:
    """Did this request draft, and how much of it was accepted."""
    return {"speculative": speculative, "drafts": spec.drafts, "draft_tokens": spec.draft_tokens,
            "accepted_tokens": spec.accepted_tokens, "accepted_per_position": list(spec.accepted_per_position),
            "acceptance_rate": spec.acceptance_rate, "mean_acceptance_length": spec.mean_acceptance_length}


def vllm_spec_metrics(spec: SpecStats) -> dict:
    """The request's acceptance in vLLM 0.32's shape (`metrics.speculative_decoding`, what
    `--per-request-spec-decode-metrics summary` returns), so clients of either read one field.
    acceptance_histogram[j] = drafts that accepted exactly j tokens, from accepted-at-position
    counts: e.g. 5 drafts with accepted_per_position [3, 1] -> [2, 2, 1]."""
    per_position = list(spec.accepted_per_position)
    reached = [spec.drafts] + per_position + [0]             # drafts that accepted at least j
    histogram = [reached[j] - reached[j + 1] for j in range(len(per_position) + 1)]
    return {"mean_acceptance_length": spec.mean_acceptance_length or 1.0,
            "draft_acceptance_rate": spec.acceptance_rate or 0.0, "acceptance_histogram": histogram,
            "num_spec_steps": spec.drafts, "num_accepted_draft_tokens": spec.accepted_tokens,
            "num_draft_tokens": spec.draft_tokens, "num_spec_tokens": len(per_position)}


class Responder(ABC):
    """Builds the bodies of one request's answer; subclasses name the object types and choice shape."""

    id_prefix = ""
    object_name = ""
    chunk_object_name = ""

    def __init__(self, model: str, speculative: bool, request, formatter: LogprobFormatter):
        self.id = self.id_prefix + uuid.uuid4().hex
        self.model = model
        self.created = int(time.time())
        self.speculative = speculative
        self.include_usage = request.include_usage
        self.continuous_usage = request.continuous_usage
        self.formatter = formatter
        self.num_choices = request.num_choices

    def body(self, finished: list[Finished]) -> dict:
        chosen = finished
        if len(finished) > self.num_choices:       # best_of candidates: the most likely n
            chosen = sorted(finished, key=lambda item: item.cumulative_logprob, reverse=True)[:self.num_choices]
        choices = [{"index": index, **self.full_choice(item)} for index, item in enumerate(chosen)]
        spec = SpecStats()
        for item in finished:
            spec = spec.merge(item.output.spec)
        completion = sum(len(item.output.output_token_ids) for item in finished)
        body = {**self._header(self.object_name), "choices": choices,
                "usage": usage(len(finished[0].output.prompt_token_ids), completion),
                "specwise": acceptance(self.speculative, spec)}
        if self.speculative and len(finished) == 1:      # vLLM reports it for single-sequence requests only
            body["metrics"] = {"speculative_decoding": vllm_spec_metrics(spec)}
        return body

    def opening_chunks(self, num_choices: int, prompt_tokens: int) -> list[dict]:
        return []

    def chunk(self, index: int, output: RequestOutput, usage_so_far: dict | None) -> dict | None:
        """The stream chunk of one choice's step, or None when it has nothing to say."""
        fields = self.delta_choice(output)
        if fields is None:
            return None
        choice = {"index": index, **fields, "finish_reason": self.finish_reason(output) if output.finished else None}
        payload = {**self._header(self.chunk_object_name), "choices": [choice]}
        if self.include_usage or self.continuous_usage:
            payload["usage"] = usage_so_far if self.continuous_usage else None
        if output.finished:
            payload["specwise"] = acceptance(self.speculative, output.spec)
            if self.speculative and self.num_choices == 1:
                payload["metrics"] = {"speculative_decoding": vllm_spec_metrics(output.spec)}
        return payload

    def usage_chunk(self, total: dict) -> dict:
        return {**self._header(self.chunk_object_name), "choices": [], "usage": total}

    def finish_reason(self, output: RequestOutput) -> str | None:
        return output.finish_reason

    @abstractmethod
    def full_choice(self, finished: Finished) -> dict:
        """The choice fields of a non-streamed answer, besides index."""

    @abstractmethod
    def delta_choice(self, output: RequestOutput) -> dict | None:
        """The choice fields of one stream chunk, besides index and finish_reason (None: no chunk)."""

    def _header(self, object_name: str) -> dict:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model}


class CompletionResponder(Responder):
    id_prefix = "cmpl-"
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def __init__(self, model: str, speculative: bool, request, formatter: LogprobFormatter, echo: str = ""):
        super().__init__(model, speculative, request, formatter)
        self.echo = echo                       # the prompt's text when echo is true
        self.show_logprobs = request.logprobs is not None     # not when asked only to rank best_of
        # request id -> text_offset of its next token: the echo, then the output's token texts summed
        # (as in the non-streamed body, whatever the detokenizer holds back)
        self.sent: dict[str, int] = {}

    def full_choice(self, finished: Finished) -> dict:
        logprobs = None
        if finished.logprobs is not None and self.show_logprobs:
            logprobs = self.formatter.completion(finished.logprobs, len(self.echo),
                                                 self._prompt(finished.output, finished.prompt_logprobs))
        return {"text": self.echo + finished.output.text, "logprobs": logprobs,
                "finish_reason": finished.output.finish_reason}

    def delta_choice(self, output: RequestOutput) -> dict | None:
        if not (output.new_text or output.finished or output.new_logprobs or output.prompt_logprobs):
            return None
        first = output.request_id not in self.sent
        offset = self.sent.setdefault(output.request_id, len(self.echo))
        text = (self.echo if first else "") + output.new_text
        self.sent[output.request_id] = offset + sum(len(self.formatter.token(t)) for t in output.new_token_ids)
        logprobs = None if output.new_logprobs is None else self.formatter.completion(
            output.new_logprobs, offset, self._prompt(output, output.prompt_logprobs))
        return {"text": text, "logprobs": logprobs}

    def _prompt(self, output: RequestOutput, prompt_logprobs) -> tuple | None:
        return None if prompt_logprobs is None else (output.prompt_token_ids, prompt_logprobs)


class ChatResponder(Responder):
    id_prefix = "chatcmpl-"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def __init__(self, model: str, speculative: bool, request, formatter: LogprobFormatter):
        super().__init__(model, speculative, request, formatter)
        tools: ToolChoice | None = request.tool_choice_info()
        self.tools = tools if tools is not None and tools.mode != "none" else None
        self.wants_logprobs = request.requested_logprobs() is not None
        self.held: dict[str, list[TokenLogprob]] = {}     # request id -> logprobs held for the next chunk
        self.streams: dict[str, ToolCallStream] = {}      # request id -> its streamed tool calls

    def message(self, text: str) -> tuple[dict, bool]:
        """(the assistant message, whether it holds tool calls)."""
        calls, content = self.tools.calls(text) if self.tools is not None else (None, text)
        if calls:
            return {"role": "assistant", "content": content, "tool_calls": calls}, True
        return {"role": "assistant", "content": text}, False

    def full_choice(self, finished: Finished) -> dict:
        message, called = self.message(finished.output.text)
        logprobs = None if finished.logprobs is None else self.formatter.chat(finished.logprobs)
        return {"message": message, "logprobs": logprobs,
                "finish_reason": self._finish_reason(finished.output, called)}

    def finish_reason(self, output: RequestOutput) -> str | None:
        return self._finish_reason(output, self.tools is not None and self.message(output.text)[1])

    @staticmethod
    def _finish_reason(output: RequestOutput, called: bool) -> str | None:
        """"tool_calls" for a message with calls, unless max_tokens cut it ("length": a named call's
        arguments may then be cut too)."""
        return "tool_calls" if called and output.finish_reason != "length" else output.finish_reason

    def opening_chunks(self, num_choices: int, prompt_tokens: int) -> list[dict]:
        chunks = []
        for index in range(num_choices):
            payload = {**self._header(self.chunk_object_name),
                       "choices": [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None}]}
            if self.include_usage or self.continuous_usage:
                payload["usage"] = usage(prompt_tokens, 0) if self.continuous_usage else None
            chunks.append(payload)
        return chunks

    def delta_choice(self, output: RequestOutput) -> dict | None:
        if self.tools is not None and self.tools.mode in ("required", "named"):
            return self._call_deltas(output)
        if self.tools is not None:                  # the whole message, once finished
            if output.new_logprobs:
                self.held.setdefault(output.request_id, []).extend(output.new_logprobs)
            if not output.finished:
                return None
            message, called = self.message(output.text)
            delta = {"tool_calls": [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]} \
                if called else {"content": message["content"]}
            held = self.held.pop(output.request_id, None)
            return {"delta": delta, "logprobs": self.formatter.chat(held) if held and self.wants_logprobs else None}
        if not (output.new_text or output.finished or output.new_logprobs):
            return None
        logprobs = None if output.new_logprobs is None else self.formatter.chat(output.new_logprobs)
        return {"delta": {"content": output.new_text} if output.new_text or not output.finished else {},
                "logprobs": logprobs}

    def _call_deltas(self, output: RequestOutput) -> dict | None:
        """Tool call deltas as the grammar-forced output grows; logprobs ride with the next chunk."""
        named = self.tools.name if self.tools.mode == "named" else None
        stream = self.streams.setdefault(output.request_id, ToolCallStream(named))
        if output.new_logprobs:
            self.held.setdefault(output.request_id, []).extend(output.new_logprobs)
        deltas = stream.feed(output.new_text)
        delta = {"tool_calls": deltas} if deltas else {}
        if output.finished:
            self.streams.pop(output.request_id)
            if not stream.started and stream.text:       # cut before a call was named: the text, as unstreamed
                delta = {"content": stream.text}
        elif not deltas:
            return None
        held = self.held.pop(output.request_id, None)
        return {"delta": delta, "logprobs": self.formatter.chat(held) if held and self.wants_logprobs else None}
