"""Prometheus metrics of one app, in its own CollectorRegistry, all under the `specwise:` prefix.

Request-side figures (counts by HTTP status and finish reason, tokens, TTFT / TPOT / e2e)
are recorded as requests run. Engine-side figures (running / waiting requests, KV blocks,
speculative counters, the current k) are read from the engine at scrape time. The
speculative counters mean what vLLM's `vllm:spec_decode_*` counters mean, with the
definitions of `specwise.engine.spec_decode.metrics`: a draft is one verification step of one sequence
that carried draft tokens; accepted_per_pos{position=i} counts drafts that accepted
position i. Each engine-side field is read without the engine lock: every counter is
monotonic on its own, and they agree with each other whenever the engine is idle.
"""

import time
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from specwise.engine.llm_engine import LLMEngine
from specwise.engine.outputs import RequestOutput

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)


def current_k(engine: LLMEngine) -> int:
    """Draft tokens per sequence the engine chose for its latest step (0 without a drafter);
    a speculation policy moves it between 0 and num_speculative_tokens."""
    return engine.step_k if engine.proposer is not None else 0


class ServerMetrics:
    def __init__(self, engine: LLMEngine, admitted: Callable[[], int]):
        self.registry = CollectorRegistry()
        self.requests = Counter("specwise:requests", "Generation requests answered, by route and HTTP status "
                                "(499: the client left before the answer started)", ["route", "status"],
                                registry=self.registry)
        self.finished = Counter("specwise:requests_finished", "Requests that reached the engine, by how they "
                                "ended (stop, length, abort, error)", ["finish_reason"], registry=self.registry)
        self.prompt_tokens = Counter("specwise:prompt_tokens", "Prompt tokens of requests the engine took (once "
                                     "per request, whatever its n or best_of)", registry=self.registry)
        self.generation_tokens = Counter("specwise:generation_tokens", "Tokens generated", registry=self.registry)
        self.ttft = Histogram("specwise:time_to_first_token_seconds", "Arrival to first generated token",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.tpot = Histogram("specwise:time_per_output_token_seconds", "(e2e - TTFT) / (output tokens - 1), "
                              "per request with at least two tokens", buckets=TPOT_BUCKETS, registry=self.registry)
        self.e2e = Histogram("specwise:e2e_request_latency_seconds", "Arrival to last token",
                             buckets=E2E_BUCKETS, registry=self.registry)
        self.registry.register(EngineCollector(engine, admitted))

    def track(self, num_prompt_tokens: int) -> "RequestTracker":
        return RequestTracker(self, num_prompt_tokens)


class RequestTracker:
    """Times one request from arrival; each figure is recorded once."""

    def __init__(self, metrics: ServerMetrics, num_prompt_tokens: int):
        self.metrics = metrics
        self.arrival = time.perf_counter()
        self.first_token_at: float | None = None
        self.num_prompt_tokens = num_prompt_tokens
        self.num_tokens = 0
        self.started = False
        self.done = False

    def observe(self, output: RequestOutput) -> None:
        if not self.started:
            self.started = True
            self.metrics.prompt_tokens.inc(self.num_prompt_tokens)
        if not output.new_token_ids:
            return
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
            self.metrics.ttft.observe(self.first_token_at - self.arrival)
        self.num_tokens += len(output.new_token_ids)
        self.metrics.generation_tokens.inc(len(output.new_token_ids))

    def finish(self, finish_reason: str) -> None:
        if self.done:
            return
        self.done = True
        self.metrics.finished.labels(finish_reason).inc()
        if finish_reason in ("abort", "error") or self.first_token_at is None:
            return
        e2e = time.perf_counter() - self.arrival
        self.metrics.e2e.observe(e2e)
        if self.num_tokens > 1:
            self.metrics.tpot.observe((e2e - (self.first_token_at - self.arrival)) / (self.num_tokens - 1))


class EngineCollector(Collector):
    def __init__(self, engine: LLMEngine, admitted: Callable[[], int]):
        self.engine = engine
        self.admitted = admitted

    def collect(self):
        engine, stats = self.engine, self.engine.stats
        yield gauge("specwise:num_requests_running", "Requests in the running batch", len(engine.scheduler.running))
        yield gauge("specwise:num_requests_waiting", "Requests waiting for the batch", len(engine.scheduler.waiting))
        yield gauge("specwise:num_requests_admitted", "Requests the server holds (bounded by max_num_seqs + "
                    "max_queue)", self.admitted())
        yield gauge("specwise:forward_compiled", "1 while the compiled graphs serve, 0 while the eager forward does "
                    "(without --compile, or while the graphs compile in the background)", int(engine.compiled))
        yield gauge("specwise:kv_cache_blocks_used", "KV-cache blocks in use", engine.block_manager.num_used_blocks)
        yield gauge("specwise:kv_cache_blocks_free", "KV-cache blocks free", engine.block_manager.num_free_blocks)
        yield counter("specwise:spec_decode_num_drafts", "Verification steps that carried draft tokens", stats.drafts)
        yield counter("specwise:spec_decode_num_draft_tokens", "Draft tokens proposed", stats.draft_tokens)
        yield counter("specwise:spec_decode_num_accepted_tokens", "Draft tokens accepted", stats.accepted_tokens)
        positions = CounterMetricFamily("specwise:spec_decode_num_accepted_tokens_per_pos",
                                        "Drafts that accepted the token at this position", labels=["position"])
        for position, count in enumerate(list(stats.accepted_per_position)):
            positions.add_metric([str(position)], count)
        yield positions
        yield counter("specwise:spec_decode_drafting_seconds", "Wall time in the drafter", stats.drafting_seconds)
        yield counter("specwise:spec_decode_verifying_seconds", "Wall time in verification steps",
                      stats.verifying_seconds)
        yield gauge("specwise:spec_decode_k", "Current k: draft tokens per sequence in the latest step, as the "
                    "speculation policy chose it (0: speculation off)", current_k(engine))
        yield gauge("specwise:spec_decode_cache_tokens", "Tokens the drafter keeps across requests (suffix "
                    "decoding's cache of earlier responses; bounded)", getattr(engine.proposer, "cached_tokens", 0))
        yield gauge("specwise:structured_output_grammars_cached", "Compiled grammars cached (bounded)",
                    engine.grammars.num_cached)
        yield gauge("specwise:spec_decode_max_k", "Most draft tokens per sequence per step (num_speculative_tokens)",
                    engine.num_speculative_tokens)
        method = GaugeMetricFamily("specwise:spec_decode_info", "Drafting method and speculation policy (value 1)",
                                   labels=["method", "policy"])
        method.add_metric([engine.config.speculative or "none", engine.config.speculative_policy], 1)
        yield method


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


class StatusCounter:
    """ASGI middleware: counts each answer on the generation routes by the status it started with."""

    def __init__(self, app, counter: Counter, routes: tuple[str, ...]):
        self.app = app
        self.counter = counter
        self.routes = routes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] not in self.routes:
            return await self.app(scope, receive, send)
        status = None

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        except Exception:
            status = status or 500
            raise
        finally:
            self.counter.labels(scope["path"], str(status or 499)).inc()
