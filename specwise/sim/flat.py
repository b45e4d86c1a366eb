"""The flat-step simulator: today's engines on paper, step by step.

One simulated step is what our engine's scheduler (engine/scheduler.py, as vLLM V1's) builds:
the running sequences' decode rows, each with its draft rows (k for a chain; for lookahead the
tree's rows, docs/design.md), then prompt chunks within max_num_batched_tokens; preemption of
the newest running sequence when the KV cache is full. The simulator does not copy that logic:
it drives the engine's own Scheduler and BlockManager over Sequences with placeholder token ids
and no model, and calls the same `draft_room` and `step_done` bookkeeping as LLMEngine. So a
simulated step's rows, tokens and preemptions are the engine's for the same state.

What the model adds: how long each step takes (the step-cost model, below), how many drafts each
verification accepts (drawn per request, or a replayed request's own as counted:
sim/request_acceptance.py) and how long each output is (the workload's max_tokens: measured
lengths or a trace's, reached like EOS would be).

A step's time. Decode part, n sequences over C cached tokens: a plain step, plus the draft rows
fed as a share of n x k times the difference to a full verification of 1 + k rows (lookahead:
1 + its rows), plus the drafter's time. Prompt part: the prefill time of the chunks. A step
with both is one forward, so the fixed cost (a plain batch-1 step over no context) is paid once:
    time = max(decode, prompt, decode + prompt - fixed) (+ the arm's per-step overhead)
Worked example: decode 40 ms, chunk 300 ms, fixed 30 ms: 310 ms. A linear model
(engine/cost/linear_cost.py) costs the step as it is: its rows, the KV tokens they read (padded as the
server's attention pads its reads, where the profile says how: engine/cost/kv_reads.py), the attention
pairs they compute (a prompt chunk's among its own tokens too) and the rows it samples; where the
profile holds the speculating server's own fit for the arm's method (a calibration against that
server), the arm's steps are costed with it. A linear model's request
overhead (a server's HTTP and tokenizing time) delays each request's admission by that much, the
server taking arriving requests one at a time (a wave sent at once is admitted one overhead apart).
Whatever the overhead, an idle engine starts its step on the first request to reach it, alone: the
others of a wave sent at once join the next step (evaluate opens each round's connections so that its
first request reaches the server first: docs/design.md, "Measurement rules"). A busy engine's next step
starts the instant its last one ends, without a request sent at that instant (`_reached`).
A linear model's cost of a new token count (a server building its kernels for a count it has not run
lately, bench/calibrate/counts.py) is charged to each step whose token count is not among the last
`count_memory` distinct counts the run's steps had (engine/cost/linear_cost.py RecentCounts).
"""

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from specwise.bench.inputs.request import WorkloadRequest
from specwise.bench.load.arrivals import DRAIN_FACTOR, LoadPoint
from specwise.bench.results import RequestRecord
from specwise.calc.arms import SpecArm
from specwise.calc.drafter import ExtraRowsCost
from specwise.engine.block_manager import BlockManager
from specwise.engine.cost.linear_cost import LinearStepCost, RecentCounts, StepShape
from specwise.engine.cost.step_cost import StepCostModel
from specwise.engine.scheduler import ScheduledBatch, Scheduler, draft_room
from specwise.engine.sequence import Sequence
from specwise.errors import ConfigError
from specwise.sampling_params import SamplingParams
from specwise.sim.request_acceptance import Draws, assign
from specwise.sim.workload import prompt_tokens, send_times

UNBOUNDED_CONTEXT = 1 << 40          # no context window unless one is given


@dataclass
class FlatResult:
    arm: str
    load: LoadPoint
    records: list[RequestRecord]
    kv_blocks: int
    peak_kv_blocks: int = 0
    preemptions: int = 0
    steps: int = 0
    duration: float = 0.0
    cut_off: int = 0                  # sent but still running at the time limit (not recorded)


@dataclass
class _Request:
    index: int
    seq: Sequence
    draws: Draws
    send: float = math.nan
    finish: float = math.nan
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)
    start: np.ndarray = field(default_factory=lambda: np.zeros(3))    # its draws' random start
    verifications: int = 0


# A request's n-th verification draws (u, v, w) = start + n x these, mod 1: a Weyl sequence, spread
# evenly over [0, 1) along the request's steps (irrational steps, independent of each other), so a
# request accepts its own rates' share to within a draw or two instead of a binomial's spread.
WEYL = np.array([(5 ** 0.5 - 1) / 2, 2 ** 0.5 - 1, 3 ** 0.5 - 1])


def schedule_step(scheduler: Scheduler, k: int, tree_rows: int, max_model_len: int
                  ) -> tuple[ScheduledBatch | None, list[Sequence]]:
    """The engine's next step for this state, by the engine's own scheduler: the batch (None when
    nothing can run) and the sequences it preempted. k: the step's draft tokens per sequence (the
    arm's k for the running batch); tree_rows: a draft tree's rows per sequence (lookahead), fed
    whenever k > 0, or 0 for a chain."""
    budget = (tree_rows if k else 0) if tree_rows else k
    before = set(id(seq) for seq in scheduler.waiting)
    batch = scheduler.schedule(lambda seq: draft_room(seq, budget, max_model_len, counts_rows=bool(tree_rows)))
    return batch, [seq for seq in scheduler.waiting if id(seq) not in before]


class FlatSimulator:
    def __init__(self, cost: StepCostModel, server, kv_capacity_tokens: int, seed: int = 0,
                 max_model_len: int | None = None):
        if kv_capacity_tokens < server.block_size:
            raise ConfigError(f"the KV cache holds {kv_capacity_tokens} tokens: the model does not fit")
        self.cost, self.server, self.seed = cost, server, seed
        self.kv_blocks = kv_capacity_tokens // server.block_size
        self.max_model_len = max_model_len or UNBOUNDED_CONTEXT

    def run(self, requests: list[WorkloadRequest], arm: SpecArm, load: LoadPoint, burstiness: float = 1.0,
            duration: float | None = None, own: dict[str, Draws] | None = None,
            arrivals: list[float] | None = None, after: dict[str, str] | None = None) -> FlatResult:
        """`own`: request id -> its measured acceptance; `arrivals`: send times to use instead of
        the load point's (a replayed run's own), one per request; `after`: request id -> the id of
        the session turn it follows (a closed loop's worker holds a turn until that one has finished,
        as evaluate's session replay does)."""
        return _Run(self, requests, arm, load, burstiness, duration, own, arrivals, after or {}).simulate()


class _Run:
    def __init__(self, sim: FlatSimulator, requests, arm: SpecArm, load: LoadPoint, burstiness, duration, own,
                 arrivals, after: dict[str, str]):
        self.sim, self.arm, self.load = sim, arm, load
        # a linear profile may hold the speculating server's own fit for this arm's method
        self.cost = sim.cost.for_method(arm.method) if isinstance(sim.cost, LinearStepCost) else sim.cost
        self.recent = RecentCounts(getattr(self.cost, "new_count_s", 0.0), getattr(self.cost, "count_memory", 0))
        self.duration = math.inf if duration is None else duration
        self.scheduler = Scheduler(BlockManager(sim.kv_blocks, sim.server.block_size), sim.server.max_num_seqs,
                                   sim.server.max_num_batched_tokens)
        self.tree_rows = arm.draft.rows if isinstance(arm.draft, ExtraRowsCost) else 0
        self.max_k = arm.policy.max_k if arm.speculative else 0
        self.rng = np.random.default_rng(sim.seed)
        draws = assign(requests, arm, self.max_k, sim.seed, own)
        self.requests = [self._request(i, r, d) for i, (r, d) in enumerate(zip(requests, draws))]
        self.by_seq = {r.seq.seq_id: r for r in self.requests}
        index = {request.request_id: i for i, request in enumerate(requests)}
        self.previous = {i: index[after[request.request_id]] for i, request in enumerate(requests)
                         if after.get(request.request_id) in index}
        self.held: dict[int, _Request] = {}               # previous turn's index -> the turn a worker holds
        self.claimed: set[int] = set()                     # taken by a worker: sent, or held on its turn before
        self.categories = [request.category for request in requests]
        self.errors: dict[int, str] = {}
        self.now, self.steps, self.preemptions, self.peak = 0.0, 0, 0, 0
        self.fixed = float(self.cost.step_times(1, 1, np.zeros(1))[0])
        # a server's own latency outside any step (HTTP, tokenizing; engine/cost/linear_cost.py): a request
        # reaches the scheduler that long after it is sent
        self.overhead = getattr(self.cost, "request_overhead_s", 0.0)
        self.admitting: list[tuple[float, int]] = []          # heap of (reaches the scheduler, request)
        self.last_admitted = -math.inf
        self._plan_sends(requests, burstiness, arrivals)

    def _request(self, index: int, request: WorkloadRequest, draws: Draws) -> _Request:
        params = SamplingParams(max_tokens=max(1, request.max_tokens), ignore_eos=True)
        seq = Sequence(request.request_id, [0] * prompt_tokens(request)[0], params)
        return _Request(index, seq, draws, per_position=[0] * self.max_k, start=self.rng.random(3))

    def _plan_sends(self, requests, burstiness: float, arrivals) -> None:
        size, lookahead = self.sim.server.block_size, max(self.max_k, self.tree_rows)
        for r in self.requests:
            need = -(-(len(r.seq) + r.seq.sampling_params.max_tokens + lookahead) // size)
            if need > self.sim.kv_blocks:
                self.errors[r.index] = f"needs {need * size} KV tokens; the cache holds {self.sim.kv_blocks * size}"
        times = arrivals if arrivals is not None else send_times(requests, self.load, burstiness, self.sim.seed)
        self.wave = 0
        if times is None:                                 # closed loop: workers send as others finish
            self.pending, self.arrivals = deque(self.requests), deque()
            self.wave = min(int(self.load.value), len(self.requests))
            for _ in range(int(self.load.value)):
                self._send_next()
            return
        self.pending = deque()
        self.arrivals = deque(sorted(((t, r.index) for r, t in zip(self.requests, times) if t < self.duration)))

    def _send(self, r: _Request, time: float) -> None:
        r.send = time
        if r.index in self.errors:
            r.finish = time
            return
        # the server handles arriving requests one at a time: a wave sent at once is admitted one
        # overhead apart (none: together, though an idle engine still starts on the first alone, below)
        self.last_admitted = max(time, self.last_admitted) + self.overhead
        heapq.heappush(self.admitting, (self.last_admitted, r.index))

    def _send_next(self) -> None:
        """Closed loop: the next request goes out (an impossible one ends at once: send another); a
        session turn whose previous turn a worker has taken and not finished (running, or itself held
        on the turn before it) is held by its worker until that ends, as evaluate's session replay
        does. Worked example, concurrency 3 over [t0, t1, t2]: t1 is held on t0 and t2 on t1; t2 goes
        out when t1 ends, not at once."""
        while self.pending and self.now < self.duration:
            r = self.pending.popleft()
            self.claimed.add(r.index)
            previous = self.previous.get(r.index)
            if previous in self.claimed and math.isnan(self.requests[previous].finish):
                self.held[previous] = r
                return
            self._send(r, self.now)
            if r.index not in self.errors:
                return

    def _finished(self, r: _Request) -> None:
        """r ended now: a turn held on it goes out, and r's worker sends its next request."""
        r.finish = self.now
        if r.index in self.held:
            self._send(self.held.pop(r.index), self.now)
        self._send_next()

    def simulate(self) -> FlatResult:
        limit = DRAIN_FACTOR * self.duration
        while True:
            while self.arrivals and self.arrivals[0][0] <= self.now:
                time, index = self.arrivals.popleft()
                self._send(self.requests[index], time)
            idle = not self.scheduler.has_unfinished()
            while self.admitting and self._reached(self.admitting[0][0], idle):
                self.scheduler.add(self.requests[heapq.heappop(self.admitting)[1]].seq)
                if idle:        # an idle engine starts a step on the first prompt to reach it
                    break
            if not self.scheduler.has_unfinished():
                upcoming = [events[0][0] for events in (self.arrivals, self.admitting) if events]
                if not upcoming:
                    break
                self.now = max(self.now, min(upcoming))
                continue
            if self.now >= limit and self._wave_done():
                break
            self._step()
        return self._result(limit)

    def _reached(self, admitted: float, idle: bool) -> bool:
        """Whether a request that reaches the scheduler at `admitted` is in the step starting now. A busy
        engine starts its next step the instant the last one ends, so a request sent at that instant (a
        closed loop's next, sent on the last token of the one before) joins the step after it, however
        small the overhead, none included: the client sees that token only after the step has ended, and
        the server reads its next request after that. An idle engine waits for a request and starts on it."""
        return admitted <= self.now if idle else admitted < self.now

    def _wave_done(self) -> bool:
        return sum(1 for r in self.requests[:self.wave] if not math.isnan(r.finish)) >= self.wave

    def _step(self) -> None:
        k = self.arm.k_for(max(1, len(self.scheduler.running))) if self.max_k else 0
        batch, preempted = schedule_step(self.scheduler, k, self.tree_rows, self.sim.max_model_len)
        self.preemptions += len(preempted)
        if batch is None:               # nothing can run: the head request never fits beside the rest
            waiting, running = self.scheduler.waiting, self.scheduler.running
            self._drop(waiting[0] if waiting else running[-1])
            return
        self.peak = max(self.peak, self.scheduler.block_manager.num_used_blocks)
        emitted, rows = self._draw(batch, k)
        self.now += self._seconds(batch, rows, k)
        self.steps += 1
        for index, seq in enumerate(batch.seqs):
            self._advance(seq, batch, index, emitted[index])

    def _drop(self, seq: Sequence) -> None:
        r = self.by_seq[seq.seq_id]
        self.errors[r.index] = "does not fit in the KV cache"
        self.scheduler.finish(seq, "abort")
        self._finished(r)

    def _draw(self, batch: ScheduledBatch, k: int) -> tuple[list[int], list[int]]:
        """Tokens each entry emits and the draft rows it fed (0: verified its last token only)."""
        emitted, rows = [], []
        for index, seq in enumerate(batch.seqs):
            room = batch.num_draft_tokens[index]
            if not batch.samples(index):
                emitted.append(0)
                rows.append(0)
                continue
            r = self.by_seq[seq.seq_id]
            accepted, drafted = 0, 0
            if room:
                r.verifications += 1
                u, v, w = (r.start + r.verifications * WEYL) % 1.0
                depth = min(k, room) if not self.tree_rows else k
                if r.draws.replay is not None:
                    # a measured request's own drafts, as counted; a short room cuts a draft as it would
                    replayed = r.draws.replay.draft(r.verifications)
                    if replayed is not None:
                        accepted, drafted = min(replayed[0], depth), min(replayed[1], depth)
                elif v < r.draws.fraction:
                    accepted = int(np.sum(u < r.draws.rates[:depth]))
                    # a draft of the request's mean length: floor or ceiling of length x depth, never
                    # shorter than what it accepts
                    mean = r.draws.length * depth
                    drafted = max(accepted, int(mean) + int(w < mean - int(mean)))
                if drafted:
                    r.drafts, r.draft_tokens, r.accepted = r.drafts + 1, r.draft_tokens + drafted, r.accepted + accepted
                    for position in range(accepted):
                        r.per_position[position] += 1
            left = seq.sampling_params.max_tokens - seq.num_output_tokens
            emitted.append(min(1 + accepted, left))
            rows.append(room if self.tree_rows else drafted)      # a tree feeds all its rows
        return emitted, rows

    def _seconds(self, batch: ScheduledBatch, rows: list[int], k: int) -> float:
        decode = [i for i in range(len(batch.seqs)) if batch.num_new_tokens[i] == 1 and batch.samples(i)]
        chunks = [batch.num_new_tokens[i] for i in sorted(set(range(len(batch.seqs))) - set(decode))]
        if isinstance(self.cost, LinearStepCost):
            return self._linear_seconds(batch, rows, k, decode)
        seconds = 0.0
        if decode:
            n = len(decode)
            total = np.array([float(sum(batch.seqs[i].num_computed_tokens for i in decode))])
            plain = float(self.cost.step_times(n, 1, total)[0])
            drafting = [i for i in decode if rows[i]]
            seconds = plain
            if drafting:
                width = self.tree_rows or k
                full = float(self.cost.step_times(n, 1 + width, total)[0])
                # the verification rows fed, as a share of a full step's n x width
                seconds += sum(rows[i] for i in drafting) / (n * width) * (full - plain) + self.arm.overhead_s
                if not self.tree_rows:
                    capped = total if self.arm.draft.kv_budget is None else np.array([float(sum(
                        min(batch.seqs[i].num_computed_tokens, self.arm.draft.kv_budget) for i in decode))])
                    seconds += float(self.arm.draft.draft_times(n, k, total, capped)[0])
        if chunks:
            prompt = self.cost.prefill_time(chunks) + self.arm.draft.prefill_time(chunks)
            seconds = prompt if not decode else max(seconds, prompt, seconds + prompt - self.fixed)
        return seconds

    def _linear_seconds(self, batch: ScheduledBatch, rows: list[int], k: int, decode: list[int]) -> float:
        """A linear model costs the flat step as it is: every row it computes, every KV token it reads (as the
        server reads them, where the profile says: engine/cost/kv_reads.py),
        every attention pair (engine/cost/linear_cost.py StepShape: each sequence's rows, its drafts included,
        over its cache), every row it samples (a decode row and its drafts; a prompt chunk only at its
        last token), and its token count where the server has not run that count lately."""
        shape = StepShape.of([new + drafts for new, drafts in zip(batch.num_new_tokens, rows)],
                             [seq.num_computed_tokens for seq in batch.seqs], self.cost.kv_reads)
        sampled = sum(1 + rows[i] for i in range(len(batch.seqs)) if batch.samples(i))
        seconds = float(self.cost.seconds(shape, sampled)) + self.recent.cost(float(shape.tokens))
        if any(rows[i] for i in decode):
            seconds += self.arm.overhead_s
            if not self.tree_rows:
                total = np.array([float(sum(batch.seqs[i].num_computed_tokens for i in decode))])
                seconds += float(self.arm.draft.draft_times(len(decode), k, total, total)[0])
        return seconds

    def _advance(self, seq: Sequence, batch: ScheduledBatch, index: int, emitted: int) -> None:
        self.scheduler.step_done(seq, batch.num_new_tokens[index], emitted)
        if not emitted:
            return
        r = self.by_seq[seq.seq_id]
        seq.token_ids.extend([0] * emitted)
        r.chunk_times.append(self.now - r.send)
        r.chunk_tokens.append(emitted)
        if seq.num_output_tokens >= seq.sampling_params.max_tokens:
            self.scheduler.finish(seq, "length")
            self._finished(r)
        else:
            self.scheduler.return_lookahead(seq)

    def _result(self, limit: float) -> FlatResult:
        keep_all = not self._wave_done()
        records, cut, ends = [], 0, []
        for r in self.requests:
            if math.isnan(r.send):
                continue
            if math.isnan(r.finish) or (r.finish > limit and not (keep_all or r.index < self.wave)):
                cut += 1
                continue
            records.append(self._record(r))
            ends.append(r.finish)
        sends = [r.send for r in self.requests if not math.isnan(r.send)]
        return FlatResult(arm=self.arm.name, load=self.load, records=records, kv_blocks=self.sim.kv_blocks,
                          peak_kv_blocks=self.peak, preemptions=self.preemptions, steps=self.steps,
                          duration=max(ends) - min(sends) if ends else 0.0, cut_off=cut)

    def _record(self, r: _Request) -> RequestRecord:
        seq = r.seq
        base = dict(arm=self.arm.name, method=self.arm.method, load_kind=self.load.kind,
                    load_value=self.load.value, category=self.categories[r.index], request_id=seq.request_id,
                    prompt_tokens=seq.num_prompt_tokens, send_time=r.send)
        if r.index in self.errors:
            return RequestRecord(**base, output_tokens=0, error=self.errors[r.index])
        record = RequestRecord(**base, output_tokens=seq.num_output_tokens, ttft=r.chunk_times[0],
                               e2e=r.finish - r.send, chunk_times=list(r.chunk_times),
                               chunk_tokens=list(r.chunk_tokens))
        if self.arm.speculative:
            record.drafts, record.draft_tokens, record.accepted_tokens = r.drafts, r.draft_tokens, r.accepted
            record.accepted_per_position = list(r.per_position)
        return record

