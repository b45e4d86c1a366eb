"""The evaluation target seam: a request in, timed stream events out.

Every target (the in-process engine, an OpenAI-compatible endpoint) yields the same
events, and one function (measure.py) turns them into a RequestRecord, so every arm
is timed and counted the same way:

    TokenChunk  one streamed piece of output, stamped with time.perf_counter() on arrival;
                `tokens` is the count it carries when the target knows it (None otherwise)
    Usage       the server's token counts, once, at the end
    Acceptance  this request's speculative counters, when the target reports them

A target raises TargetError (or any exception) for a failed request; measure.py records
the message in RequestRecord.error and keeps whatever streamed before the failure.
"""

from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol

from specwise.bench.inputs.request import WorkloadRequest


@dataclass
class TokenChunk:
    time: float
    text: str
    tokens: int | None = None


@dataclass
class Usage:
    prompt_tokens: int | None
    completion_tokens: int | None


@dataclass
class Acceptance:
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: list[int] = field(default_factory=list)


StreamEvent = TokenChunk | Usage | Acceptance


@dataclass
class ServerAcceptance:
    """Server-wide speculative counters (cumulative); differenced around each load point.

    Servers that only publish ratios (SGLang's gauges) give `rate` / `length` instead of
    counters; those are reported as the server's own figures, not recomputed.
    """
    source: str                                 # "vllm", "specwise", "sglang"
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    accepted_per_position: list[float] = field(default_factory=list)
    rate: float | None = None
    length: float | None = None


class TargetError(Exception):
    """A request failed in a way the target can describe in one line."""


class Target(Protocol):
    name: str       # the arm name, e.g. "off", "ngram-k4", "vllm-eagle"
    method: str     # "off", "ngram", "draft", "layer_skip", "eagle", ... or "http"

    async def start(self) -> None:
        """Get ready, once per run, before any request (open the HTTP client, check the endpoint)."""

    async def activate(self) -> bool | None:
        """Make this arm the one being served, before each of its rounds (the in-process
        engine switches its drafter; an endpoint needs nothing; a launched server in blocks
        starts). True when a server was (re)started: the runner warms it up again."""

    async def reconnect(self) -> None:
        """Before each round: the same connections open whatever ran before (an endpoint: one;
        the in-process engine has none)."""

    async def close(self) -> None:
        """Release what start() acquired; the run calls it once per arm."""

    def stream(self, request: WorkloadRequest) -> AsyncIterator[StreamEvent]:
        """Send one request; yield its events as they arrive."""

    async def server_acceptance(self) -> ServerAcceptance | None:
        """Cumulative server-side counters, or None when the target has none."""
