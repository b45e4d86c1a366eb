"""Metric definitions (docs/design.md vocabulary), computed from RequestRecords.

    TTFT  = first chunk arrival - send
    TPOT  = (e2e - TTFT) / (output_tokens - 1), per request with >= 2 output tokens
    ITL   = gaps between consecutive streamed chunks, pooled over requests. Chunk-level:
            under speculation one chunk may carry several tokens.
    throughput = completed requests (or their output tokens) / window, where the window
            runs from the first send to the last finish of each round of the load point,
            summed over its rounds
    goodput    = completed requests meeting every SLO given / window
    acceptance rate = sum(accepted) / sum(draft tokens); mean acceptance length =
            1 + sum(accepted) / sum(drafts): sums of counters, never means of ratios.
Percentiles interpolate linearly between order statistics (numpy's default).
"""

import math
from collections import Counter
from dataclasses import dataclass, field

from specwise.bench.results import RequestRecord


@dataclass
class Stats:
    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


@dataclass
class AcceptanceStats:
    drafts: float | None                # None: the source gave only ratios (SGLang gauges)
    draft_tokens: float | None
    accepted_tokens: float | None
    rate: float | None                  # accepted / draft tokens
    mean_length: float | None           # 1 + accepted / drafts
    per_position: list[float] = field(default_factory=list)     # accepted at i / drafts
    source: str = "requests"            # "requests", or the server whose counters were read


@dataclass
class PointMetrics:
    requests: int
    completed: int
    errors: int
    error_kinds: dict[str, int]
    window: float
    ttft: Stats
    tpot: Stats
    itl: Stats
    e2e: Stats
    prompt_tokens: int
    output_tokens: int
    request_throughput: float | None
    output_throughput: float | None
    goodput: float | None
    acceptance: AcceptanceStats | None


def percentile(values, q: float) -> float | None:
    """q in [0, 100]; linear interpolation, e.g. percentile([1, 2, 3, 4], 50) == 2.5."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def stats(values) -> Stats:
    values = list(values)
    if not values:
        return Stats()
    return Stats(count=len(values), mean=sum(values) / len(values), p50=percentile(values, 50),
                 p90=percentile(values, 90), p99=percentile(values, 99))


def request_tpot(record: RequestRecord) -> float | None:
    if record.error or record.ttft is None or record.e2e is None or record.output_tokens < 2:
        return None
    return (record.e2e - record.ttft) / (record.output_tokens - 1)


# a request's own latency by name (None: it has none, e.g. an error or a single output token)
REQUEST_LATENCY = {"ttft": lambda r: r.ttft, "tpot": request_tpot, "e2e": lambda r: r.e2e}


def itl_gaps(record: RequestRecord) -> list[float]:
    times = record.chunk_times
    return [later - earlier for earlier, later in zip(times, times[1:])]


def window(records: list[RequestRecord]) -> float:
    """First send to last finish, seconds, summed over the rounds of the point (between an
    arm's rounds the other arms run: that time is not this arm's)."""
    by_round: dict = {}
    for record in records:
        if record.e2e is not None:
            by_round.setdefault(record.round, []).append(record)
    return sum(max(r.send_time + r.e2e for r in timed) - min(r.send_time for r in timed)
               for timed in by_round.values())


def acceptance(records: list[RequestRecord]) -> AcceptanceStats | None:
    counted = [r for r in records if r.drafts is not None and not r.error]
    if not counted:
        return None
    drafts = sum(r.drafts for r in counted)
    positions: list[float] = []
    for record in counted:
        for index, value in enumerate(record.accepted_per_position or []):
            positions.extend([0.0] * (index + 1 - len(positions)))
            positions[index] += value
    return acceptance_stats(drafts, sum(r.draft_tokens for r in counted),
                            sum(r.accepted_tokens for r in counted), positions)


def acceptance_stats(drafts, draft_tokens, accepted, per_position=(), source="requests") -> AcceptanceStats:
    return AcceptanceStats(
        drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted,
        rate=accepted / draft_tokens if draft_tokens else None,
        mean_length=1 + accepted / drafts if drafts else None,
        per_position=[value / drafts for value in per_position] if drafts else [], source=source)


def server_acceptance_stats(entry: dict) -> AcceptanceStats:
    """From a run.json "server_acceptance" entry (a ServerAcceptance as a dict)."""
    if entry.get("drafts") is None:
        return AcceptanceStats(None, None, None, rate=entry.get("rate"), mean_length=entry.get("length"),
                               source=entry["source"])
    return acceptance_stats(entry["drafts"], entry["draft_tokens"], entry["accepted_tokens"],
                            entry.get("accepted_per_position") or [], source=entry["source"])


def point_metrics(records: list[RequestRecord], slo=None, window_s: float | None = None) -> PointMetrics:
    """Metrics of one group (an arm at one load point, or one category of it).

    `window_s`: the load point's window, so that a category's throughput is its share
    of the same wall time; by default the group's own window.
    """
    records = [r for r in records if not r.warmup]
    done = [r for r in records if not r.error]
    span = window(records) if window_s is None else window_s
    rate = (lambda n: n / span) if span > 0 else (lambda n: None)
    output_tokens = sum(r.output_tokens for r in done)
    return PointMetrics(
        requests=len(records), completed=len(done), errors=len(records) - len(done),
        error_kinds=dict(Counter(r.error for r in records if r.error).most_common(5)), window=span,
        ttft=stats(r.ttft for r in done if r.ttft is not None),
        tpot=stats(t for t in map(request_tpot, done) if t is not None),
        itl=stats(gap for r in done for gap in itl_gaps(r)),
        e2e=stats(r.e2e for r in done if r.e2e is not None),
        prompt_tokens=sum(r.prompt_tokens for r in done), output_tokens=output_tokens,
        request_throughput=rate(len(done)), output_throughput=rate(output_tokens),
        goodput=None if slo is None or not slo.given() else rate(sum(slo.met_by(r) for r in done)),
        acceptance=acceptance(done))
