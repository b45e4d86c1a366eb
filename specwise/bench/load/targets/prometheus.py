"""Speculative counters from a server's Prometheus /metrics page, and vLLM's KV cache.

Counter families (cumulative; differenced before/after each load point, or each block when
servers restart between blocks, the blocks' differences then summed by add()):
  vllm:spec_decode_num_drafts_total, ..._num_draft_tokens_total,
  ..._num_accepted_tokens_total, ..._num_accepted_tokens_per_pos_total{position="i"}
  specwise:spec_decode_* with the same names (our own server).
SGLang publishes gauges instead (sglang:spec_accept_rate, sglang:spec_accept_length):
those are windowed averages kept by the server, reported as they are after the point.
"""

import re

import httpx

from specwise.bench.load.targets.base import ServerAcceptance

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_COUNTER_PREFIXES = ("vllm", "specwise")
VLLM_CACHE_INFO = "vllm:cache_config_info"      # its labels: block_size, num_gpu_blocks (the KV cache's blocks)


def parse_exposition(text: str) -> list[tuple[str, dict, float]]:
    """Text exposition format -> [(name, labels, value)]; unparsable lines are ignored."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match.group(4))
        except ValueError:
            continue
        labels = {key: _unescape(raw) for key, raw in _LABEL.findall(match.group(3) or "")}
        samples.append((match.group(1), labels, value))
    return samples


def vllm_cache_limits(exposition: str) -> dict:
    """vLLM's /metrics page -> {"block_size", "kv_cache_tokens"} from its cache_config_info labels (None where a
    label is not a positive number); {} where it has none. vLLM for CPU 0.32 with 2 GiB of KV for SmolLM2-135M:
    block_size="128", num_gpu_blocks="728": 93,184 tokens."""
    for name, labels, _ in parse_exposition(exposition):
        if name == VLLM_CACHE_INFO:
            block, blocks = (_positive(labels.get(key)) for key in ("block_size", "num_gpu_blocks"))
            return {"block_size": block, "kv_cache_tokens": block * blocks if block and blocks else None}
    return {}


def _positive(text: str | None) -> int | None:
    try:
        value = int(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


def acceptance_from_samples(samples) -> ServerAcceptance | None:
    for prefix in _COUNTER_PREFIXES:
        found = _counters(samples, prefix)
        if found is not None:
            return found
    return _sglang_gauges(samples)


def difference(before: ServerAcceptance | None, after: ServerAcceptance | None) -> ServerAcceptance | None:
    """Counters accumulated between two scrapes; gauges as read at the second."""
    if after is None:
        return None
    if after.drafts is None or before is None or before.source != after.source:
        return after
    positions = len(after.accepted_per_position)
    earlier = before.accepted_per_position + [0.0] * (positions - len(before.accepted_per_position))
    return ServerAcceptance(
        source=after.source, drafts=after.drafts - before.drafts,
        draft_tokens=after.draft_tokens - before.draft_tokens,
        accepted_tokens=after.accepted_tokens - before.accepted_tokens,
        accepted_per_position=[a - b for a, b in zip(after.accepted_per_position, earlier)])


def add(total: ServerAcceptance | None, more: ServerAcceptance | None) -> ServerAcceptance | None:
    """Two differences summed (in blocks, one per block: a restart zeroes the counters); gauges, or
    counters from another source: the later reading."""
    if total is None or more is None:
        return more if total is None else total
    if total.drafts is None or more.drafts is None or total.source != more.source:
        return more
    positions = max(len(total.accepted_per_position), len(more.accepted_per_position))
    per_position = [a + b for a, b in zip(_padded(total.accepted_per_position, positions),
                                          _padded(more.accepted_per_position, positions))]
    return ServerAcceptance(source=more.source, drafts=total.drafts + more.drafts,
                            draft_tokens=total.draft_tokens + more.draft_tokens,
                            accepted_tokens=total.accepted_tokens + more.accepted_tokens,
                            accepted_per_position=per_position)


async def scrape(client: httpx.AsyncClient, url: str) -> ServerAcceptance | None:
    """GET url and read the counters; None when the page is missing or has none."""
    try:
        response = await client.get(url, timeout=10.0)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return acceptance_from_samples(parse_exposition(response.text))


def _counters(samples, prefix: str) -> ServerAcceptance | None:
    def total(suffix: str) -> float | None:
        names = {f"{prefix}:spec_decode_{suffix}", f"{prefix}:spec_decode_{suffix}_total"}
        values = [value for name, _, value in samples if name in names]
        return sum(values) if values else None

    drafts, draft_tokens, accepted = total("num_drafts"), total("num_draft_tokens"), total("num_accepted_tokens")
    if drafts is None or draft_tokens is None or accepted is None:
        return None
    per_position: dict[int, float] = {}
    names = {f"{prefix}:spec_decode_num_accepted_tokens_per_pos",
             f"{prefix}:spec_decode_num_accepted_tokens_per_pos_total"}
    for name, labels, value in samples:
        if name in names and labels.get("position", "").isdigit():
            position = int(labels["position"])
            per_position[position] = per_position.get(position, 0.0) + value
    ordered = [per_position.get(i, 0.0) for i in range(max(per_position) + 1)] if per_position else []
    return ServerAcceptance(source=prefix, drafts=drafts, draft_tokens=draft_tokens,
                            accepted_tokens=accepted, accepted_per_position=ordered)


def _sglang_gauges(samples) -> ServerAcceptance | None:
    def mean(name: str) -> float | None:
        values = [value for sample_name, _, value in samples if sample_name == name]
        return sum(values) / len(values) if values else None

    rate, length = mean("sglang:spec_accept_rate"), mean("sglang:spec_accept_length")
    if rate is None and length is None:
        return None
    return ServerAcceptance(source="sglang", rate=rate, length=length)


def _padded(values: list[float], length: int) -> list[float]:
    return list(values) + [0.0] * (length - len(values))


def _unescape(raw: str) -> str:
    return raw.replace(r"\"", '"').replace(r"\n", "\n").replace("\\\\", "\\")
