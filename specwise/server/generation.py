"""One request's life on the server: prompt checks, bounded admission, the engine run, cleanup.

`Serving.start` first admits the request's n choices unless `max_num_seqs + max_queue` are
already held (429: answered before any work is spent on the request), then, in a worker thread,
tokenizes (tools through the chat template when it renders them, else in the system prompt:
tool_prompt.py), checks the prompt and max_tokens against the context window and the KV cache,
and compiles a structured-output grammar (a first grammar builds the tokenizer's index, about a
second): the event loop never waits for any of it. Each returned Job (one per choice, or per
candidate with best_of) holds one admitted seat and must be closed exactly once (`close` is
idempotent): closing an unfinished job aborts it in the engine, which frees its KV blocks.
"""

import asyncio
import uuid

import jinja2

from specwise.engine.async_engine import AsyncEngine
from specwise.engine.fault_isolation import EngineDead
from specwise.engine.llm_engine import Prompt
from specwise.engine.outputs import RequestOutput, TokenLogprob
from specwise.errors import SpecwiseError
from specwise.sampling_params import SamplingParams
from specwise.server.config import ServerConfig
from specwise.server.errors import APIError
from specwise.server.metrics import ServerMetrics
from specwise.server import tool_prompt
from specwise.server.protocol import GenerationRequest


class Serving:
    def __init__(self, async_engine: AsyncEngine, config: ServerConfig):
        self.async_engine = async_engine
        self.engine = async_engine.engine
        self.capacity = self.engine.config.max_num_seqs + config.max_queue
        self.admitted = 0
        self.metrics = ServerMetrics(self.engine, lambda: self.admitted)

    async def start(self, prompt: Prompt, request: GenerationRequest, param: str, default_max_tokens: int | None,
                    tools: list[dict] | None = None, tenant: str | None = None) -> "list[Job]":
        if self.async_engine.dead is not None:
            raise APIError(503, f"the engine is dead ({self.async_engine.dead}); the server is exiting",
                           code="engine_dead")
        count = request.num_candidates
        self.admit(count)
        try:
            # tokenizing, the chat template and a grammar's compilation take milliseconds to a second:
            # never on the event loop, which must answer /health and the next request's 429 meanwhile
            token_ids, params = await asyncio.to_thread(self.prepare, prompt, request, param, default_max_tokens,
                                                        tools)
            # the prompt is counted once per request (as vLLM), however many choices share it
            jobs = [Job(self, token_ids, choice_params, count_prompt=index == 0, tenant=tenant)
                    for index, choice_params in enumerate(params)]
        except BaseException:
            self.admitted -= count
            raise
        return jobs

    def admit(self, count: int) -> None:
        """Hold `count` sequences of the bound, before any work is spent on the request (no await: the check and
        the hold are one step of the event loop); 429 when they do not fit, 400 when they never could."""
        if count > self.capacity:
            raise APIError(400, f"this request asks for {count} sequences (n, best_of); the server admits at "
                                f"most {self.capacity} at once (--max-num-seqs + --max-queue)", "n", "invalid_value")
        if self.admitted + count > self.capacity:
            max_num_seqs = self.engine.config.max_num_seqs
            max_queue = self.capacity - max_num_seqs
            raise APIError(429, f"the queue is full: {self.admitted} requests are admitted and this one adds "
                                f"{count}, over the bound of {self.capacity} ({max_num_seqs} running "
                                f"(--max-num-seqs) + {max_queue} queued (--max-queue)); retry later",
                           code="queue_full", details={"admitted": self.admitted, "capacity": self.capacity,
                                                       "max_num_seqs": max_num_seqs, "max_queue": max_queue})
        self.admitted += count

    def prepare(self, prompt: Prompt, request: GenerationRequest, param: str, default_max_tokens: int | None,
                tools: list[dict] | None) -> tuple[list[int], list[SamplingParams]]:
        """The prompt's token ids and each candidate's settings, checked (a worker thread: reads no step state)."""
        token_ids = self.encode(prompt, param, tools)
        max_tokens = self.max_tokens(len(token_ids), *request.requested_max_tokens, default_max_tokens, param)
        params = [request.sampling_params(max_tokens, choice) for choice in range(request.num_candidates)]
        try:
            self.engine.check_params(params[0])       # compiles (and caches) a grammar
        except SpecwiseError as error:
            raise APIError(400, str(error), grammar_param(request, params[0]), "invalid_value") from None
        return token_ids, params

    def encode(self, prompt: Prompt, param: str, tools: list[dict] | None = None) -> list[int]:
        tokenizer = self.engine.tokenizer
        try:
            if param == "messages" and not tokenizer.template_takes_tools:
                prompt, tools = tool_prompt.as_text(prompt, tools), None     # tools in the system prompt
            if tools:        # the chat template shows the tools
                return tokenizer.apply_chat_template(prompt, tools=tools)
            return self.engine.encode(prompt)
        except (SpecwiseError, jinja2.TemplateError) as error:
            raise APIError(400, str(error), param, "invalid_value") from None

    def max_tokens(self, prompt_len: int, requested: int | None, field: str, default: int | None,
                   param: str) -> int:
        """max_tokens as given, or the default capped to what fits; 400 when nothing or too little fits."""
        window = self.engine.max_model_len
        cache = self.engine.block_manager.num_blocks * self.engine.block_manager.block_size
        room = min(window, cache) - prompt_len
        if room < 1:
            raise APIError(400, f"the prompt has {prompt_len} tokens; the context window is {window} tokens and "
                                f"the KV cache holds {cache} (prompt + at least one output token)",
                           param, "context_length_exceeded")
        if requested is None:
            return room if default is None else min(default, room)
        if requested < 1:
            raise APIError(400, f"{field} must be at least 1, got {requested}", field, "invalid_value")
        if requested > room:
            raise APIError(400, f"{field} ({requested}) + prompt ({prompt_len} tokens) exceeds the context "
                                f"window ({window} tokens) or the KV cache ({cache} tokens)",
                           field, "context_length_exceeded")
        return requested


def grammar_param(request: GenerationRequest, params: SamplingParams) -> str | None:
    """The field a refused grammar came from, for the error body."""
    if params.structured_output is None:
        return None
    for name in ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar"):
        if getattr(request, name, None) is not None:
            return name
    return "tools"


class Job:
    def __init__(self, serving: Serving, token_ids: list[int], params: SamplingParams, count_prompt: bool = True,
                 tenant: str | None = None):
        self.serving = serving
        self.request_id = uuid.uuid4().hex
        self.speculative = serving.engine.proposer is not None and params.speculative
        self.tracker = serving.metrics.track(len(token_ids) if count_prompt else 0)
        self.outputs = serving.async_engine.generate(token_ids, params, self.request_id, tenant)
        self.refused = False
        self.closed = False
        self.logprobs: list[TokenLogprob] | None = None if params.logprobs is None else []
        self.prompt_logprobs: list[TokenLogprob | None] | None = None     # with the first output, if asked
        self.cumulative_logprob = 0.0          # of the generated tokens (best_of ranks candidates by it)

    async def next(self) -> RequestOutput:
        """The next output (call until one is finished); APIError when the engine refuses or fails it."""
        try:
            output = await anext(self.outputs)
        except SpecwiseError as error:
            self.refused = True
            raise APIError(400, str(error), code="invalid_value") from None
        except EngineDead as error:
            self.tracker.finish("error")
            raise APIError(503, str(error), code="engine_dead") from None
        except RuntimeError as error:
            self.tracker.finish("error")
            raise APIError(500, str(error), code="engine_error") from None
        self.tracker.observe(output)
        if output.prompt_logprobs is not None:
            self.prompt_logprobs = output.prompt_logprobs
        if self.logprobs is not None and output.new_logprobs:
            self.logprobs.extend(output.new_logprobs)
            self.cumulative_logprob += sum(item.logprob for item in output.new_logprobs)
        if output.finished:
            self.tracker.finish(output.finish_reason)
            if output.finish_reason == "abort":
                raise APIError(503, "the request was aborted by the server", code="aborted")
        return output

    async def collect(self) -> RequestOutput:
        output = await self.next()
        while not output.finished:
            output = await self.next()
        return output

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.serving.admitted -= 1
        if not self.refused:
            self.tracker.finish("abort")
        await self.outputs.aclose()
