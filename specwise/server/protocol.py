"""Request bodies of /v1/completions and /v1/chat/completions, validated strictly.

Unknown fields are refused by name. OpenAI parameters this server does not implement
(logprobs, logit_bias, penalties, tools, n > 1, ...) are accepted only at their neutral
value, so a client never gets an answer computed without a setting it asked for.
Extensions: top_k, ignore_eos, min_tokens (with ignore_eos), stop_token_ids, and
`speculative: false` to switch drafting off for one request.
"""

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from specwise.errors import ConfigError
from specwise.sampling_params import SamplingParams
from specwise.server.errors import APIError

MAX_STOP_STRINGS = 16
COMPLETION_DEFAULT_MAX_TOKENS = 16      # as in the OpenAI completions API
StopString = Annotated[str, Field(min_length=1)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(StrictModel):
    include_usage: bool = False


class GenerationRequest(StrictModel):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    stop: StopString | list[StopString] | None = Field(None, max_length=MAX_STOP_STRINGS)
    stop_token_ids: list[int] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    ignore_eos: bool | None = None
    min_tokens: int | None = Field(None, ge=0)
    speculative: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: int | None = None
    logit_bias: dict[str, Any] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None

    NEUTRAL: ClassVar[dict] = {"n": (None, 1), "logit_bias": (None, {}), "presence_penalty": (None, 0),
               "frequency_penalty": (None, 0), "top_logprobs": (None, 0),
               "response_format": (None, {"type": "text"})}

    def check_supported(self) -> None:
        for name, neutral in self.NEUTRAL.items():
            if getattr(self, name) not in neutral:
                raise APIError(400, f"{name}={getattr(self, name)!r} is not supported by this server",
                               name, "unsupported_parameter")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed when stream is true", "stream_options")
        if self.min_tokens and not (self.ignore_eos and not self.stop and not self.stop_token_ids):
            raise APIError(400, "min_tokens > 0 is supported only with ignore_eos=true and no stop or "
                                "stop_token_ids (then every request runs to max_tokens)",
                           "min_tokens", "unsupported_parameter")

    @property
    def requested_max_tokens(self) -> tuple[int | None, str]:
        """The output budget asked for, and the field that asked."""
        return self.max_tokens, "max_tokens"

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        if self.min_tokens is not None and self.min_tokens > max_tokens:
            raise APIError(400, f"min_tokens ({self.min_tokens}) exceeds max_tokens ({max_tokens})", "min_tokens")
        values = {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
                  "ignore_eos": self.ignore_eos, "speculative": self.speculative,
                  "stop": [self.stop] if isinstance(self.stop, str) else self.stop,
                  "stop_token_ids": self.stop_token_ids,
                  "top_k": None if self.top_k is None else max(self.top_k, 0)}
        try:
            return SamplingParams(max_tokens=max_tokens, **{k: v for k, v in values.items() if v is not None})
        except ConfigError as error:
            raise APIError(400, str(error), code="invalid_value") from None


class CompletionRequest(GenerationRequest):
    prompt: str | list[Any]
    logprobs: int | None = None
    best_of: int | None = None
    echo: bool | None = None
    suffix: str | None = None

    NEUTRAL: ClassVar[dict] = {**GenerationRequest.NEUTRAL, "logprobs": (None, 0), "best_of": (None, 1),
               "echo": (None, False), "suffix": (None, "")}

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


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]]
    name: str | None = None

    def template_message(self, index: int) -> dict:
        role = "system" if self.role == "developer" else self.role
        if isinstance(self.content, str):
            return {"role": role, "content": self.content}
        texts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(400, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported",
                               f"messages.{index}.content", "unsupported_content")
            texts.append(part["text"])
        return {"role": role, "content": "".join(texts)}


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None

    NEUTRAL: ClassVar[dict] = {**GenerationRequest.NEUTRAL, "logprobs": (None, False), "tools": (None, []),
               "tool_choice": (None, "none")}

    @property
    def requested_max_tokens(self) -> tuple[int | None, str]:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def template_messages(self) -> list[dict]:
        return [message.template_message(index) for index, message in enumerate(self.messages)]
