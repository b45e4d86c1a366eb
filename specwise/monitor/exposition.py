"""One scrape of a server's Prometheus /metrics page, read into a `Snapshot`.

The text is parsed with prometheus_client's parser; the speculative counters are then
picked out by `acceptance_from_samples` (the reader `evaluate` uses), so both tools read
the same names:

  server     speculative figures                                   load and output
  vllm       vllm:spec_decode_num_drafts_total                     vllm:num_requests_running
             vllm:spec_decode_num_draft_tokens_total               vllm:num_requests_waiting
             vllm:spec_decode_num_accepted_tokens_total            vllm:generation_tokens_total
             vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}
  specwise   specwise:spec_decode_* with the same names            specwise:num_requests_running, ..._waiting,
             (our server, specwise/server/metrics.py)              specwise:generation_tokens_total
  sglang     gauges sglang:spec_accept_rate, sglang:spec_accept_length (averages the server keeps
             over its own logging interval: reported as read, not recomputed);
             sglang:num_requests_running, ..._waiting, sglang:generation_tokens_total

The server is recognised by its metric prefix. Samples with several label sets (several
engines, data-parallel ranks) are summed; SGLang's gauges are averaged across ranks.

Worked example, the vLLM fixture (tests/data/vllm-0.32-cpu-ngram-metrics.txt):
    server = "vllm", drafts = 2583, draft tokens = 10332, accepted = 6125,
    accepted per position = [1910, 1588, 1403, 1224], generation tokens = 12379,
    running = 0, waiting = 0.
"""

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from specwise.bench.load.targets.base import ServerAcceptance
from specwise.bench.load.targets.prometheus import acceptance_from_samples
from specwise.errors import InputError

SERVERS = ("vllm", "specwise", "sglang")


class ExpositionError(InputError):
    """The page cannot be read as speculative counters; the message says why, in one line."""


@dataclass(frozen=True)
class Snapshot:
    server: str                            # "vllm" | "specwise" | "sglang"
    time: float                            # seconds (time.time()) when the page was read
    acceptance: ServerAcceptance           # cumulative counters (vllm, specwise) or gauges (sglang)
    generation_tokens: float | None = None  # cumulative output tokens
    running: float | None = None           # requests in the running batch (gauge)
    waiting: float | None = None           # requests queued (gauge)
    metric_names: tuple[str, ...] = field(default=(), repr=False)

    @property
    def has_counters(self) -> bool:
        return self.acceptance.drafts is not None


def parse_snapshot(text: str, time: float, where: str = "response") -> Snapshot:
    """Exposition text -> Snapshot; ExpositionError when it is not Prometheus text, comes from
    none of the servers we know, or carries no speculative figures."""
    samples = _samples(text, where)
    names = sorted({name for name, _, _ in samples})
    server = detect_server(names)
    if server is None:
        raise ExpositionError(f"{where}: a Prometheus page, but with no vllm:, sglang: or specwise: metrics "
                              f"({len(names)} metric names); is this the inference server's /metrics?")
    acceptance = acceptance_from_samples([s for s in samples if s[0].startswith(server + ":")])
    if acceptance is None or _speculation_off(samples, server):
        raise ExpositionError(f"{where}: {server} exports no speculative decoding metrics: is speculation "
                              f"on? ({_how_to_enable(server)})")
    return Snapshot(server=server, time=time, acceptance=acceptance,
                    generation_tokens=_total(samples, f"{server}:generation_tokens"),
                    running=_total(samples, f"{server}:num_requests_running"),
                    waiting=_total(samples, f"{server}:num_requests_waiting"),
                    metric_names=tuple(names))


def detect_server(names) -> str | None:
    """The server whose prefix has speculative metrics; else the one with the most metrics."""
    counts = {server: sum(1 for name in names if name.startswith(server + ":")) for server in SERVERS}
    speculative = [server for server in SERVERS
                   if any(name.startswith(f"{server}:spec_") for name in names)]
    if speculative:
        return speculative[0]
    best = max(SERVERS, key=lambda server: counts[server])
    return best if counts[best] else None


def _samples(text: str, where: str) -> list[tuple[str, dict, float]]:
    """[(sample name, labels, value)]: counters keep their `_total` sample names."""
    if not text.strip():
        raise ExpositionError(f"{where}: empty page, not a Prometheus exposition")
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as error:
        first = text.strip().splitlines()[0][:60]
        raise ExpositionError(f"{where}: not a Prometheus exposition ({error}; first line: {first!r})") from None
    return [(sample.name, sample.labels, float(sample.value)) for family in families for sample in family.samples]


def _speculation_off(samples, server: str) -> bool:
    """Our server exports its counters (at 0) even without a drafter; its info gauge says so."""
    return any(name == f"{server}:spec_decode_info" and labels.get("method") == "none"
               for name, labels, _ in samples)


def _total(samples, name: str) -> float | None:
    """Sum over label sets of `name` (counters: `name_total`); None when absent."""
    wanted = {name, name + "_total"} if not name.endswith("_total") else {name}
    values = [value for sample_name, _, value in samples if sample_name in wanted]
    return sum(values) if values else None


def _how_to_enable(server: str) -> str:
    return {"vllm": "start vLLM with --speculative-config",
            "sglang": "start SGLang with --speculative-algorithm and --enable-metrics",
            "specwise": "start `specwise serve` with --speculative"}[server]
