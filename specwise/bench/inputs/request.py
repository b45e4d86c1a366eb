"""One request of a workload: what `evaluate` sends and `simulate` models.

Built-in suite prompts carry text; user JSONL carries text or chat messages; production
traces carry only token counts (prompt text is synthesized to that length when replayed
on a real target, and the output is forced to `max_tokens` with ignore_eos).
"""

from dataclasses import dataclass, field


@dataclass
class WorkloadRequest:
    request_id: str
    category: str
    prompt: str | None = None                 # plain completion prompt
    messages: list[dict] | None = None        # chat messages [{"role": ..., "content": ...}]
    max_tokens: int = 128
    prompt_tokens: int | None = None          # known token count (traces), else None
    arrival_time: float | None = None         # seconds from trace start (trace replay), else None
    ignore_eos: bool = False                  # force exactly max_tokens (trace replay)
    extra: dict = field(default_factory=dict)
