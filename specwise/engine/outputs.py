"""What `LLMEngine.step()` returns: one RequestOutput per request that advanced."""

from dataclasses import dataclass, field


@dataclass
class SpecCounters:
    """Per-request speculative counters; definitions in specwise/spec/metrics.py."""
    drafts: int = 0            # verification steps that carried at least one draft token
    draft_tokens: int = 0      # draft tokens proposed
    accepted_tokens: int = 0   # draft tokens accepted
    accepted_per_position: list[int] = field(default_factory=list)


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]     # everything generated so far
    new_token_ids: list[int]        # generated in this step (several under speculation)
    text: str                       # detokenized output so far (stop strings removed)
    new_text: str                   # text added in this step; never splits a UTF-8 character
    finished: bool
    finish_reason: str | None       # "stop" (eos / stop token / stop string), "length", "abort"
    spec: SpecCounters = field(default_factory=SpecCounters)
