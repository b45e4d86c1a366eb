"""Request bodies of /v1/completions and /v1/chat/completions, validated as vLLM's OpenAI server does.

Parameters fall in three groups:
  - honoured: the OpenAI parameters (max_tokens / max_completion_tokens, temperature, top_p,
    stop, seed, n, presence / frequency penalties, logit_bias, logprobs, top_logprobs, echo,
    stream_options, response_format, tools, tool_choice, user, ...) and vLLM's extensions
    (top_k, min_tokens, ignore_eos, repetition_penalty, stop_token_ids,
    stream_options.continuous_usage_stats, guided_json / guided_regex / guided_choice /
    guided_grammar), plus ours: `speculative: false` switches drafting off for one request;
  - known but unsupported (UNSUPPORTED below): a 400 naming the parameter, so no answer is
    computed without a setting the client asked for;
  - unknown: ignored, with a warning in the server log (clients add vendor extensions freely).
"""

import json
import logging
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from specwise.errors import ConfigError
from specwise.sampling_params import MAX_LOGPROBS, SamplingParams, StructuredOutput
from specwise.server.errors import APIError
from specwise.server.structured import ResponseFormat, structured_output
from specwise.server.tools import ToolChoice, resolve

log = logging.getLogger("specwise.server")

MAX_STOP_STRINGS = 16
MAX_N = 16
COMPLETION_DEFAULT_MAX_TOKENS = 16      # as in the OpenAI completions API
StopString = Annotated[str, Field(min_length=1)]
# parameter -> why it is refused (a 400 when given with anything but a neutral value)
UNSUPPORTED = {"suffix": "suffix (insertion) is not supported", "functions": "use tools instead of functions",
               "function_call": "use tool_choice instead of function_call",
               "prompt_logprobs": "use echo with logprobs on /v1/completions for prompt logprobs",
               "audio": "audio output is not supported",
               "prediction": "predicted outputs are not supported",
               "web_search_options": "web search is not supported"}
NEUTRAL = (None, "", [], {}, False)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False
    continuous_usage_stats: bool = False


class GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=0)     # only the neutral value: min-p sampling is not implemented
    stop: StopString | list[StopString] | None = Field(None, max_length=MAX_STOP_STRINGS)
    stop_token_ids: list[int] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    ignore_eos: bool | None = None
    min_tokens: int | None = Field(None, ge=0)
    speculative: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: int | None = Field(None, ge=1, le=MAX_N)
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0)
    response_format: ResponseFormat | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    KNOWN_EXTRA: ClassVar[set] = {"metadata", "store", "service_tier", "reasoning_effort", "skip_special_tokens",
                                  "spaces_between_special_tokens", "include_stop_str_in_output", "priority"}

    def check_supported(self) -> None:
        extra = dict(self.model_extra or {})
        for name, reason in UNSUPPORTED.items():
            if extra.get(name, getattr(self, name, None)) not in NEUTRAL:
                raise APIError(400, f"{name}: {reason}", name, "unsupported_parameter")
        unknown = sorted(set(extra) - set(UNSUPPORTED) - self.KNOWN_EXTRA)
        if unknown:
            log.warning("ignoring unknown request parameter(s): %s", ", ".join(unknown))
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed when stream is true", "stream_options")

    @property
    def requested_max_tokens(self) -> tuple[int | None, str]:
        """The output budget asked for, and the field that asked."""
        return self.max_tokens, "max_tokens"

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    @property
    def num_choices(self) -> int:
        """Choices in the answer."""
        return self.n or 1

    @property
    def num_candidates(self) -> int:
        """Engine requests: one per choice, or best_of (completions) ranked down to n."""
        return self.num_choices

    def requested_logprobs(self) -> int | None:
        return None

    def requested_prompt_logprobs(self) -> int | None:
        return None

    def structured(self) -> StructuredOutput | None:
        return structured_output(self)

    def sampling_params(self, max_tokens: int, choice: int = 0) -> SamplingParams:
        """The engine settings of choice `choice` (of n): with a seed, choice i samples with seed + i."""
        if self.min_tokens is not None and self.min_tokens > max_tokens:
            raise APIError(400, f"min_tokens ({self.min_tokens}) exceeds max_tokens ({max_tokens})", "min_tokens",
                           "invalid_value")
        values = {"temperature": self.temperature, "top_p": self.top_p, "ignore_eos": self.ignore_eos,
                  "seed": None if self.seed is None else (self.seed + choice) % 2**63,
                  "speculative": self.speculative, "min_tokens": self.min_tokens,
                  "stop": [self.stop] if isinstance(self.stop, str) else self.stop,
                  "stop_token_ids": self.stop_token_ids, "presence_penalty": self.presence_penalty,
                  "frequency_penalty": self.frequency_penalty, "repetition_penalty": self.repetition_penalty,
                  "logit_bias": self._logit_bias(), "logprobs": self.requested_logprobs(),
                  "prompt_logprobs": self.requested_prompt_logprobs(),
                  "structured_output": self.structured(),
                  "top_k": None if self.top_k is None else max(self.top_k, 0)}
        try:
            return SamplingParams(max_tokens=max_tokens, **{k: v for k, v in values.items() if v is not None})
        except ConfigError as error:
            raise APIError(400, str(error), code="invalid_value") from None

    def _logit_bias(self) -> dict[int, float] | None:
        if not self.logit_bias:
            return None
        try:
            bias = {int(token): float(value) for token, value in self.logit_bias.items()}
        except ValueError:
            raise APIError(400, "logit_bias keys must be token ids", "logit_bias", "invalid_value") from None
        if any(not -100 <= value <= 100 for value in bias.values()):
            raise APIError(400, "logit_bias values must be in [-100, 100]", "logit_bias", "invalid_value")
        return bias


class CompletionRequest(GenerationRequest):
    prompt: str | list[Any]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    echo: bool | None = None
    suffix: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.best_of is not None and self.best_of < self.num_choices:
            raise APIError(400, f"best_of ({self.best_of}) must be at least n ({self.num_choices})", "best_of",
                           "invalid_value")
        if self.stream and self.num_candidates > self.num_choices:
            raise APIError(400, f"best_of ({self.best_of}) greater than n ({self.num_choices}) cannot be streamed",
                           "best_of", "invalid_value")

    @property
    def num_candidates(self) -> int:
        return self.best_of or self.num_choices

    def requested_logprobs(self) -> int | None:
        """Candidates are ranked by their tokens' logprobs: asked for internally when best_of > n."""
        if self.logprobs is None and self.num_candidates > self.num_choices:
            return 0
        return self.logprobs

    def requested_prompt_logprobs(self) -> int | None:
        """echo with logprobs: the prompt's tokens come back with their logprobs too."""
        return self.logprobs if self.echo else None

    def single_prompt(self) -> str | list[int]:
        """A string or a list of token ids; a one-element batch of either is unwrapped."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise APIError(400, f"one prompt per request (got {len(prompt)}); send them as separate requests",
                               "prompt", "unsupported_parameter")
            prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt
        if not prompt or not all(type(token) is int for token in prompt):
            raise APIError(400, "prompt must be a string, a non-empty list of token ids, or a one-element list "
                                "of either", "prompt", "invalid_value")
        return prompt


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def template_message(self, index: int) -> dict:
        """The message as chat templates take it: text content; assistant tool calls and tool
        results kept (templates that know tools render them)."""
        message = {"role": "system" if self.role == "developer" else self.role, "content": self.text(index)}
        if self.tool_calls:
            message["tool_calls"] = [{**call, "function": {**call.get("function", {}), "arguments": _arguments(call)}}
                                     for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message

    def text(self, index: int) -> str:
        if self.content is None:
            if self.role == "assistant" and self.tool_calls:
                return ""
            raise APIError(400, "content is required (null only for an assistant message with tool_calls)",
                           f"messages.{index}.content", "invalid_value")
        if isinstance(self.content, str):
            return self.content
        texts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(400, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported",
                               f"messages.{index}.content", "unsupported_content")
            texts.append(part["text"])
        return "".join(texts)


def _arguments(call: dict) -> Any:
    """Templates (Llama 3.1, Qwen2.5) expect arguments as an object; OpenAI sends a JSON string."""
    arguments = call.get("function", {}).get("arguments", {})
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    modalities: list[str] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs", "invalid_value")
        if self.modalities and set(self.modalities) != {"text"}:
            raise APIError(400, "only text output is supported", "modalities", "unsupported_parameter")

    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def tool_choice_info(self) -> ToolChoice | None:
        return resolve(self.tools, self.tool_choice, self.parallel_tool_calls)

    def template_tools(self) -> list[dict] | None:
        """Tools as chat templates take them (none when tool_choice is "none")."""
        choice = self.tool_choice_info()
        return None if choice is None or choice.mode == "none" else self.tools

    @property
    def requested_max_tokens(self) -> tuple[int | None, str]:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def template_messages(self) -> list[dict]:
        return [message.template_message(index) for index, message in enumerate(self.messages)]
