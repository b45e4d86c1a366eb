"""`specwise calibrate --endpoint URL`: a short designed sweep against any OpenAI-compatible server,
fitted to the step-cost model the simulator reads (engine/cost/linear_cost.py, engine/cost/step_fit.py).

The design: first, for each prefill length, `prefill_repeats` single requests of one output
token, one after another: a prefill step each (its TTFT). Then, where asked (`count_probes`), the
count probe (counts.py): single requests of that many new token counts, then each again beside a new
one, what a step of a token count the server has not run lately costs it. Then, for each prompt length and each
batch size, one wave of `batch_size` requests sent together, prompts of that length (cut from the
suite categories' texts in turn, bench/inputs/synthetic.py), outputs forced to `output_tokens` (ignore_eos
with min_tokens = max_tokens, as trace replay sends them): a decode step at that batch size and
context (calibrate/samples.py). Waves run every batch size at the shortest prompt first, smallest
batch first, then every batch size at the next prompt length, the endpoints taking turns at each
shape; a request still running at the budget's end is cancelled, and its wave dropped.

Why batch sizes before prompt lengths: a time budget cuts the last shape it reaches for the endpoint
whose turn comes last there, the speculating one. Run cheapest first (batch x (prompt + output)
tokens: 16 x 256 before 64 x 32), the sweeps of 2026-12-07 reached batch 64 last, and the budget of
180 s cut the speculating server's wave of 64 in 21 of 29 recorded sweeps (ours and vLLM's, on the
2-core machine): its fit never saw the batch where speculation's gain runs out, and the replays put its
TPOT at 64 up to 21% off. Batch sizes first, the cut falls on a long-prompt wave at a large batch,
whose cost per cached token the long-prompt waves at small batches and the prefill probes measure too.

Requests go through the evaluator's own HTTP target (bench/load/targets/http.py) and timing
(bench/load/measure.py), with continuous usage so each chunk knows its tokens. A speculating
endpoint's drafts come from its responses (vLLM's `metrics.speculative_decoding`, our server's
`specwise` counters), else from its Prometheus counters differenced around each wave.

Why the categories take turns: a drafter's work per step depends on the text it drafts from (an
n-gram proposer finds matches in copied text, drafts k tokens and stops searching; in prose it may
search the whole context for nothing), and so does how many draft rows each step verifies. Waves
cut from one category fit a speculating server's step to that text alone: calibrated on chat text,
vLLM's n-gram server took 46 ms a step at batch 1 where the same server, evaluated on the suite's
seven categories, took 41-43 ms (2026-12-05; the plain server 42.6 against 42.5 ms). Each wave's
request i is cut from categories[(wave + i) % n], so every batch size and prompt length mixes the
workload's kinds of text as evaluate's suite does. A prefill probe's repeats come from one category
(the probe's turn), distinct windows of it: a prefill costs by its token count, not its text, and
prompts cut by characters from different categories hold different token counts (256 tokens' worth
of characters came back as 229 tokens of chat text, and as 254, the median, from three categories),
which a median over three repeats would mix.

Why every request of a sweep gets a window of its own, from a fresh place each sweep
(`window_seed`): a server that has run a prompt of exactly this token count before may run it
faster (kernels and their plans are cached by shape), and one with prefix caching reuses a prompt
that starts as an earlier one did, while real traffic's prompts and their counts are new. vLLM's
prefill probes, measured twice on one server with the same windows (2026-12-05): 70, 126 and 606 ms
at 38, 221 and 1,066 tokens the first time, 62, 113 and 503 ms the second; its decode waves
within 4%. The evaluation that followed on fresh servers took 126 ms at its 58-475-token prompts
one at a time: the first sweep's probes predicted its TTFT 6% high, the second's 7% low.
"""

import asyncio
import gc
import random
import re
import time
from dataclasses import dataclass, field
from typing import Callable

from specwise.bench.calibrate.counts import COUNT_TAG, MAX_COUNT_PROBES, MIN_RUN, count_requests
from specwise.bench.calibrate.samples import WaveSteps, prefill_sample, wave_steps
from specwise.bench.inputs.request import WorkloadRequest
from specwise.bench.inputs.suite import CATEGORIES, check_categories
from specwise.bench.inputs.synthetic import synthesize_prompts
from specwise.bench.load.measure import Slot, measure
from specwise.bench.load.targets.http import HttpTarget
from specwise.bench.load.targets.prometheus import difference
from specwise.bench.results import RequestRecord
from specwise.engine.cost.kv_reads import KVReads
from specwise.engine.cost.step_fit import StepSample
from specwise.errors import ConfigError

WARMUP_TOKENS = 8
MAX_WINDOW_SEED = 1_000_000


@dataclass
class SweepDesign:
    batch_sizes: list[int] = field(default_factory=lambda: [1, 4, 16, 64])
    prompt_tokens: list[int] = field(default_factory=lambda: [32, 256])
    output_tokens: int = 48
    prefill_tokens: list[int] = field(default_factory=lambda: [32, 256, 1024])
    prefill_repeats: int = 3
    budget_s: float = 180.0
    categories: list[str] = field(default_factory=lambda: list(CATEGORIES))
    window_seed: int | None = None       # where the sweep's prompt windows start; None: a fresh place
    max_num_batched_tokens: int | None = None   # the server's token budget: a longer probe runs in chunks
    count_probes: int = 0                # token counts the count probe revisits (counts.py, e.g. 32); 0: no probe
    # how the server reads its KV cache, to count a wave's KV tokens read (engine/cost/kv_reads.py): "GROUP/BLOCK",
    # or "none" (each sequence its own); None: what the server says (calibrate asks it), else none
    kv_reads: str | None = None

    def __post_init__(self):
        self.categories = check_categories(self.categories)
        if self.window_seed is None:
            self.window_seed = random.randrange(MAX_WINDOW_SEED)
        if not 0 <= self.window_seed < MAX_WINDOW_SEED:
            raise ConfigError(f"calibrate --endpoint: --window-seed must be in 0..{MAX_WINDOW_SEED - 1}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ConfigError("calibrate --endpoint: --max-num-batched-tokens must be at least 1")
        for name in ("batch_sizes", "prompt_tokens", "prefill_tokens"):
            values = getattr(self, name)
            if not values or min(values) < 1:
                raise ConfigError(f"calibrate --endpoint: {name.replace('_', '-')} must be positive numbers")
        if self.output_tokens < 2 * 3 + 2:
            raise ConfigError("calibrate --endpoint: --output-tokens must be at least 8 (a window of steps "
                              "between the prefills and the first finish)")
        if self.prefill_repeats < 1:
            raise ConfigError("calibrate --endpoint: --prefill-repeats must be at least 1")
        if self.budget_s <= 0:
            raise ConfigError("calibrate --endpoint: --budget must be positive seconds")
        self.reads()            # a malformed --kv-reads stops the sweep before it starts
        if self.count_probes and not 2 * MIN_RUN <= self.count_probes <= MAX_COUNT_PROBES:
            raise ConfigError(f"calibrate --endpoint: --count-probes must be 0 (no probe) or "
                              f"{2 * MIN_RUN}..{MAX_COUNT_PROBES}")

    def reads(self) -> KVReads | None:
        return KVReads.parse(self.kv_reads) if self.kv_reads is not None else None

    def waves(self) -> list[tuple[int, int]]:
        """(batch size, prompt tokens): every batch size at the shortest prompt, smallest first, then at the
        next prompt length, and so on (the module's docstring says why)."""
        return [(b, p) for p in sorted(self.prompt_tokens) for b in sorted(self.batch_sizes)]


@dataclass
class Wave:
    endpoint: str
    batch_size: int
    prompt_tokens: int
    records: list[RequestRecord]
    steps: WaveSteps | None = None
    shared_drafts: tuple[float, float] | None = None    # (drafted, accepted) from the server's counters


@dataclass
class Sweep:
    """What a sweep measured: the prefill probes, each endpoint's count probe (its records in send order),
    the waves, and the steps each endpoint that says them ran meanwhile (GET /steps lines, logged.py)."""
    probes: list["Probe"] = field(default_factory=list)
    counts: dict[str, list[RequestRecord]] = field(default_factory=dict)
    waves: list[Wave] = field(default_factory=list)
    logged: dict[str, list[dict]] = field(default_factory=dict)


@dataclass
class Probe:
    """Single requests of one prompt length, one after another: a prefill step each."""
    endpoint: str
    prompt_tokens: int
    records: list[RequestRecord]
    sample: StepSample | None = None


async def run_sweep(targets: list[HttpTarget], design: SweepDesign,
                    on_step: Callable[[], None] | None = None) -> Sweep:
    """The prefill probes, the count probe, then every wave of the design, against every target, within
    the budget (warm-up included). on_step: called after each probe and each wave."""
    # the client's own pauses delay the chunks' timestamps: a full garbage collection over everything the
    # process has imported, mid-wave, made a wave's first chunks look late and its step 12% fast (the
    # fake engine's, in a test run beside other test modules); frozen, a collection walks the sweep's objects
    gc.collect()
    gc.freeze()
    started = time.perf_counter()
    deadline = started + design.budget_s
    for target in targets:
        await target.start()
    sweep = Sweep()
    windows = _Windows(design)
    try:
        for target in targets:
            await _send(target, windows.requests(1, min(design.prompt_tokens), WARMUP_TOKENS, "warmup"),
                        started, deadline)
        for turn, prompt_tokens in enumerate(design.prefill_tokens):
            for target in targets:
                singles = windows.requests(design.prefill_repeats, prompt_tokens, 1, probe_tag(prompt_tokens),
                                           turn, one_category=True)
                records = await _one_by_one(target, singles, started, deadline)
                sweep.probes.append(Probe(target.name, prompt_tokens, records,
                                          prefill_sample(records, design.max_num_batched_tokens,
                                                         reads=design.reads())))
                if time.perf_counter() >= deadline:
                    return sweep
                if on_step:
                    on_step()
        for index, target in enumerate(targets if design.count_probes else []):
            seen = {r.prompt_tokens for probe in sweep.probes if probe.endpoint == target.name for r in probe.records}
            singles = count_requests(design.count_probes, design.window_seed + index, seen)
            sweep.counts[target.name] = await _one_by_one(target, singles, started, deadline)
            if time.perf_counter() >= deadline:
                return sweep
            if on_step:
                on_step()
        for turn, (batch_size, prompt_tokens) in enumerate(design.waves()):
            for target in targets:
                if time.perf_counter() >= deadline:
                    return sweep
                before = await target.server_acceptance()
                requests = windows.requests(batch_size, prompt_tokens, design.output_tokens,
                                            wave_tag(batch_size, prompt_tokens), turn)
                await target.reconnect()        # each wave as evaluate's rounds start
                records = await _send(target, requests, started, deadline)
                shared = _shared_drafts(before, await target.server_acceptance(), records)
                sweep.waves.append(Wave(target.name, batch_size, prompt_tokens, records,
                                        wave_steps(records, batch_size, shared, design.reads()), shared))
                if on_step:
                    on_step()
        return sweep
    finally:
        for target in targets:
            await target.close()
        gc.unfreeze()


def probe_tag(prompt_tokens: int | str) -> str:
    """A probe's requests are named TAG-i (their records keep the name; `regroup` reads it back, the tag
    made of regular-expression groups)."""
    return f"prefill-p{prompt_tokens}"


def wave_tag(batch_size: int | str, prompt_tokens: int | str) -> str:
    return f"b{batch_size}-p{prompt_tokens}"


def regroup(records: list[RequestRecord], shared_drafts: dict[tuple[str, str], tuple[float, float]],
            max_num_batched_tokens: int | None = None, reads: KVReads | None = None) -> Sweep:
    """A recorded sweep again, from its requests' records in send order (`calibrate --refit`).
    shared_drafts: (endpoint, wave tag) -> the server's (drafted, accepted) over that wave;
    max_num_batched_tokens: the server's token budget (prefill_sample); reads: how it reads its cache."""
    groups: dict[tuple[str, str], list[RequestRecord]] = {}
    for record in records:
        groups.setdefault((record.arm, record.request_id.rsplit("-", 1)[0]), []).append(record)
    sweep = Sweep()
    for (endpoint, tag), group in groups.items():
        if match := re.fullmatch(probe_tag(r"(\d+)"), tag):
            sweep.probes.append(Probe(endpoint, int(match[1]), group,
                                      prefill_sample(group, max_num_batched_tokens, reads=reads)))
        elif tag == COUNT_TAG:
            sweep.counts[endpoint] = group
        elif match := re.fullmatch(wave_tag(r"(\d+)", r"(\d+)"), tag):
            batch_size, drafts = int(match[1]), shared_drafts.get((endpoint, tag))
            steps = wave_steps(group, batch_size, drafts, reads)
            sweep.waves.append(Wave(endpoint, batch_size, int(match[2]), group, steps, drafts))
    return sweep


class _Windows:
    """The sweep's requests, each prompt from a window of its category's text no other request of the
    sweep starts at (synthesize_prompts strides through the text from first_window)."""

    def __init__(self, design: SweepDesign):
        self.design, self.next_window = design, design.window_seed

    def requests(self, batch_size: int, prompt_tokens: int, output_tokens: int, tag: str, turn: int = 0,
                 one_category: bool = False) -> list[WorkloadRequest]:
        """batch_size requests, request i cut from categories[(turn + i) % n], or all from
        categories[turn % n] with one_category."""
        names = self.design.categories
        shells = [WorkloadRequest(request_id=f"{tag}-{i}", max_tokens=output_tokens, prompt_tokens=prompt_tokens,
                                  category=names[(turn + (0 if one_category else i)) % len(names)], ignore_eos=True)
                  for i in range(batch_size)]
        # each category's shells cut together (their windows stride apart), then put back in order
        cut = {name: iter(synthesize_prompts([s for s in shells if s.category == name], name,
                                             first_window=self.next_window))
               for name in {shell.category for shell in shells}}
        self.next_window += batch_size
        return [next(cut[shell.category]) for shell in shells]


async def _one_by_one(target: HttpTarget, singles: list[WorkloadRequest], started: float,
                      deadline: float) -> list[RequestRecord]:
    """Each request after the one before has ended; none sent past the deadline."""
    records = []
    for single in singles:
        if time.perf_counter() >= deadline:
            break
        records += await _send(target, [single], started, deadline)
    return records


async def _send(target: HttpTarget, requests: list[WorkloadRequest], started: float,
                deadline: float) -> list[RequestRecord]:
    """All requests at once; a request still running at the deadline is cancelled (an error record)."""
    slot = Slot("concurrency", len(requests), started)
    timeout = max(deadline - time.perf_counter(), 0.001)
    return list(await asyncio.gather(*(measure(target, request, slot, timeout) for request in requests)))


def _shared_drafts(before, after, records: list[RequestRecord]) -> tuple[float, float] | None:
    """(draft tokens, accepted tokens) over the wave from the server's counters, where its responses
    carry none; None when they do or when the server publishes no counters."""
    if any(r.draft_tokens is not None for r in records):
        return None
    delta = difference(before, after)
    if delta is None or delta.draft_tokens is None or before is None:
        return None
    return delta.draft_tokens, delta.accepted_tokens
