"""What `LLMEngine.step()` returns: one RequestOutput per request that advanced."""

from dataclasses import dataclass, field

from specwise.engine.spec_decode.metrics import SpecStats


@dataclass
class TokenLogprob:
    """One generated token's log-probability under the target (log_softmax of the processed
    logits, before temperature: see engine/sampling/logits_processors.py), and the most likely
    tokens at that position as (token id, logprob), most likely first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]     # everything generated so far
    new_token_ids: list[int]        # generated in this step (several under speculation)
    text: str                       # detokenized output so far (stop strings removed)
    new_text: str                   # text added in this step; never splits a UTF-8 character
    finished: bool
    finish_reason: str | None       # "stop" (eos / stop token / stop string), "length", "abort", "error"
    spec: SpecStats = field(default_factory=SpecStats)   # this request's drafts so far (a snapshot)
    new_logprobs: list[TokenLogprob] | None = None        # one per new token, when the request asked
    # with the first output of a request that asked: one per prompt token, None for the first
    prompt_logprobs: list[TokenLogprob | None] | None = None
    error: str | None = None        # finish_reason "error": what this request's work raised (fault_isolation.py)
