"""A window: what a server did between two scrapes, from the difference of its counters.

Every acceptance figure comes from `SpecStats` (engine/spec_decode/metrics.py, the one
definition) built on the counter deltas:
  - acceptance rate          = accepted tokens / draft tokens
  - mean acceptance length   = 1 + accepted tokens / drafts
  - per-position acceptance  = accepted at position i / drafts
and beside them:
  - draft tokens per draft   = draft tokens / drafts (the k the drafter actually filled)
  - drafts per step          = drafts / sequence decode steps, with decode steps = output
                               tokens - accepted tokens (each step emits accepted + 1 tokens;
                               a request's first token, from prefill, counts as a step too, so
                               this slightly understates the share for short outputs)
  - output tokens/s          = generation tokens / window seconds
  - concurrency              = requests running at the window's end (a gauge)

Worked example: the vLLM fixture, then the same server 60 s later with drafts 2583 -> 2683,
draft tokens 10332 -> 10732, accepted 6125 -> 6365, per position [1910, 1588, 1403, 1224]
-> [1990, 1648, 1453, 1274], generation tokens 12379 -> 12719:
    drafts 100, draft tokens 400, accepted 240, per position [80, 60, 50, 50]
    acceptance rate 0.60, mean acceptance length 3.40, per position [0.8, 0.6, 0.5, 0.5]
    drafts per step 100 / (340 - 240) = 1.0, output 340 / 60 = 5.67 tokens/s

Counter resets: a cumulative counter that went down means the server restarted. That
window has no figures (note "counter reset") and the next one starts from the new values,
so no rate is ever negative. A failed scrape gives a window with only an error; the next
good scrape is differenced against the last good one.
Torn scrapes (a server mid-update, so per-position counts do not add up to the accepted
count) keep the three totals and drop the per-position figures of that window.
"""

import math
from dataclasses import dataclass, field

from specwise.bench.load.targets.base import ServerAcceptance
from specwise.engine.spec_decode.metrics import SpecStats
from specwise.monitor.exposition import Snapshot


@dataclass
class Window:
    url: str
    start: float                          # time of the earlier scrape (None-free: failed windows use the attempt time)
    end: float
    server: str | None = None
    stats: SpecStats | None = None        # counter deltas (vllm, specwise); None for sglang or without figures
    server_rate: float | None = None      # sglang's own acceptance rate gauge, as read at the end
    server_length: float | None = None    # sglang's own acceptance length gauge
    generation_tokens: float | None = None
    running: float | None = None
    waiting: float | None = None
    reset: bool = False
    error: str | None = None              # the scrape failed: why
    notes: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def acceptance_rate(self) -> float | None:
        return self.stats.acceptance_rate if self.stats is not None else self.server_rate

    @property
    def mean_acceptance_length(self) -> float | None:
        return self.stats.mean_acceptance_length if self.stats is not None else self.server_length

    @property
    def per_position_acceptance(self) -> list[float] | None:
        if self.stats is None or not self.stats.accepted_per_position:
            return None
        return self.stats.per_position_acceptance

    @property
    def draft_tokens_per_draft(self) -> float | None:
        return self.stats.draft_tokens / self.stats.drafts if self.stats and self.stats.drafts else None

    @property
    def drafts_per_step(self) -> float | None:
        if self.stats is None or self.generation_tokens is None:
            return None
        steps = self.generation_tokens - self.stats.accepted_tokens
        return self.stats.drafts / steps if steps > 0 else None

    @property
    def output_tokens_per_s(self) -> float | None:
        if self.generation_tokens is None or self.seconds <= 0:
            return None
        return self.generation_tokens / self.seconds

    @property
    def has_figures(self) -> bool:
        return self.acceptance_rate is not None

    def to_dict(self) -> dict:
        """One JSONL line of the monitor's log."""
        return {"url": self.url, "server": self.server, "start": self.start, "end": self.end,
                "seconds": self.seconds, "error": self.error, "reset": self.reset, "notes": self.notes,
                "drafts": self.stats.drafts if self.stats else None,
                "draft_tokens": self.stats.draft_tokens if self.stats else None,
                "accepted_tokens": self.stats.accepted_tokens if self.stats else None,
                "accepted_per_position": list(self.stats.accepted_per_position) if self.stats else None,
                "acceptance_rate": self.acceptance_rate, "mean_acceptance_length": self.mean_acceptance_length,
                "per_position_acceptance": self.per_position_acceptance,
                "draft_tokens_per_draft": self.draft_tokens_per_draft, "drafts_per_step": self.drafts_per_step,
                "generation_tokens": self.generation_tokens, "output_tokens_per_s": self.output_tokens_per_s,
                "running": self.running, "waiting": self.waiting}


def since_start(url: str, snapshot: Snapshot) -> Window:
    """A server's lifetime figures from one scrape: its counters as read, a window from zero.

    What a first scrape can show at once, before any window has elapsed. It has no duration
    (output tokens/s: none). SGLang's gauges are the server's own recent averages, as read.
    Worked example, the vLLM fixture: 6125 accepted of 10332 draft tokens in 2583 drafts give
    acceptance 0.593, mean acceptance length 3.37, drafts per step 2583 / (12379 - 6125) = 0.41.
    """
    zero = ServerAcceptance(source=snapshot.acceptance.source, drafts=0, draft_tokens=0, accepted_tokens=0)
    before = Snapshot(server=snapshot.server, time=snapshot.time,
                      acceptance=zero if snapshot.has_counters else snapshot.acceptance,
                      generation_tokens=None if snapshot.generation_tokens is None else 0.0)
    return window_between(url, before, snapshot)


def failed_window(url: str, start: float, end: float, error: str) -> Window:
    return Window(url=url, start=start, end=end, error=error)


def window_between(url: str, before: Snapshot, after: Snapshot) -> Window:
    """What happened between two good scrapes of one server."""
    window = Window(url=url, start=before.time, end=after.time, server=after.server,
                    running=after.running, waiting=after.waiting)
    if before.server != after.server:
        window.reset = True
        window.notes.append(f"server changed from {before.server} to {after.server}: window restarts")
        return window
    if not after.has_counters:                      # sglang: gauges only
        window.server_rate, window.server_length = after.acceptance.rate, after.acceptance.length
        window.generation_tokens = _delta(before.generation_tokens, after.generation_tokens)
        if window.generation_tokens is not None and window.generation_tokens < 0:
            window.generation_tokens, window.reset = None, True
            window.notes.append("counter reset (server restart?): window restarts from the new values")
        return window
    deltas = _counter_deltas(before, after)
    if deltas is None:
        window.reset = True
        window.notes.append("counter reset (server restart?): window restarts from the new values")
        return window
    drafts, draft_tokens, accepted, per_position, generation = deltas
    window.generation_tokens = generation
    window.stats = _spec_stats(drafts, draft_tokens, accepted, per_position, window.notes)
    return window


def _counter_deltas(before: Snapshot, after: Snapshot):
    """(drafts, draft tokens, accepted, per position, generation tokens) as whole numbers, or None
    when any cumulative counter went down (a restart)."""
    a, b = after.acceptance, before.acceptance
    totals = [a.drafts - b.drafts, a.draft_tokens - b.draft_tokens, a.accepted_tokens - b.accepted_tokens]
    earlier = b.accepted_per_position + [0.0] * (len(a.accepted_per_position) - len(b.accepted_per_position))
    per_position = [now - then for now, then in zip(a.accepted_per_position, earlier)]
    generation = _delta(before.generation_tokens, after.generation_tokens)
    shrank = len(a.accepted_per_position) < len(b.accepted_per_position)
    if shrank or min(totals + per_position + [generation or 0.0]) < 0:
        return None
    rounded = [int(round(value)) for value in totals]
    return (*rounded, [int(round(value)) for value in per_position], generation)


def _spec_stats(drafts: int, draft_tokens: int, accepted: int, per_position: list[int], notes) -> SpecStats | None:
    try:
        return SpecStats(drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted,
                         accepted_per_position=per_position)
    except ValueError:
        pass
    try:   # torn scrape: keep the totals; positions filled so SpecStats holds (rate and length are exact)
        stats = SpecStats(drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted,
                          accepted_per_position=_fill_positions(drafts, accepted))
    except ValueError:
        notes.append(f"inconsistent counters (accepted {accepted} of {draft_tokens} draft tokens in "
                     f"{drafts} drafts): a torn scrape; no figures for this window")
        return None
    notes.append("per-position counters do not add up to the accepted count (torn scrape): "
                 "per-position figures dropped for this window")
    stats.accepted_per_position = []
    return stats


def _fill_positions(drafts: int, accepted: int) -> list[int]:
    """Non-increasing counts, each <= drafts, summing to accepted: [drafts] * q + [r]."""
    if drafts == 0:
        return [] if accepted == 0 else [accepted]
    whole, rest = divmod(accepted, drafts)
    return [drafts] * whole + ([rest] if rest else [])


def _delta(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or math.isnan(before) or math.isnan(after):
        return None
    return after - before
