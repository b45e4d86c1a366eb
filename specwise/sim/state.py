"""The simulator's event loop: one SimState per (arm, load) run. See simulator.py for the model.

Running sequences live in parallel arrays in admission order (newest last):
run_idx (request index), run_ctx (KV tokens cached), run_rem (tokens still to emit),
run_u (index of the request's next uniform: its decode steps so far, from its stream's start)
and run_p (its category's per-position acceptance, [batch, max_k]).

A load point bounded by a duration follows evaluate's rule (bench/load/arrivals.py): nothing is sent
after `duration`, and requests still running at DRAIN_FACTOR x duration are cut off (not
recorded), unless fewer than a closed loop's first wave had finished by then.
"""

import math
from collections import deque

import numpy as np

from specwise.bench.load.arrivals import DRAIN_FACTOR
from specwise.sim.workload import prompt_tokens, send_times

MAX_STEPS_PER_EVENT = 512


class SimState:
    def __init__(self, sim, requests, arm, load, burstiness: float = 1.0, duration: float | None = None):
        self.sim, self.cost, self.server, self.arm, self.load = sim, sim.cost, sim.server, arm, load
        self.duration = math.inf if duration is None else duration
        self.requests, self.kv_blocks, self.size = requests, sim.kv_blocks, sim.server.block_size
        n = len(requests)
        self.prompt = np.array([prompt_tokens(r)[0] for r in requests], dtype=np.int64)
        self.out = np.array([max(1, r.max_tokens) for r in requests], dtype=np.int64)
        self.categories = sorted({r.category for r in requests})
        self.cat = np.array([self.categories.index(r.category) for r in requests], dtype=np.int64)
        self.send, self.first_token, self.finish = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
        self.generated = np.zeros(n, dtype=np.int64)
        self.steps_done = np.zeros(n, dtype=np.int64)      # decode steps taken, kept while preempted
        self.open_step = np.zeros(n, dtype=np.int64)      # first decode step of the open segment
        self.segments = [[] for _ in range(n)]             # ("p", time) or ("d", first step, end step)
        self.errors: dict[int, str] = {}
        self.max_k = arm.policy.max_k if arm.speculative else 0
        self.lookahead = self.max_k + 1
        self._acceptance_tables(sim.seed)
        self.waiting: deque[int] = deque()
        self.run_idx, self.run_ctx, self.run_rem, self.run_u = (np.zeros(0, dtype=np.int64) for _ in range(4))
        self.run_p = np.zeros((0, self.max_k))
        self.ctx_sum = 0                                   # run_ctx.sum(), kept up to date
        self.last_step = 0.0                               # duration of the latest decode step
        self.step_ends: list[np.ndarray] = []
        self.step_k: list[tuple[int, int]] = []            # (k, number of steps) per run of decode steps
        self.decode_steps = self.prefill_steps = self.preemptions = self.peak_blocks = 0
        self.now = self.occupancy = 0.0
        self._plan_sends(burstiness)

    def _acceptance_tables(self, seed: int) -> None:
        """p[category, i]: probability draft i + 1 is accepted; f[category]: probability a step
        drafts at all. Per request per decode step one uniform for acceptance and, when some
        f < 1, one more for drafting."""
        self.p = np.zeros((len(self.categories), self.max_k))
        self.f = np.ones(len(self.categories))
        self.u_offset = np.concatenate(([0], np.cumsum(self.out)[:-1]))
        self.uniforms, self.draft_uniforms = np.zeros(0), None
        if not self.max_k:
            return
        for index, category in enumerate(self.categories):
            acceptance = self.arm.acceptance_for(category)
            self.p[index], self.f[index] = acceptance.rates(self.max_k), acceptance.draft_fraction
        rng = np.random.default_rng(seed)
        self.uniforms = rng.random(int(self.out.sum()))
        if np.any(self.f < 1):
            self.draft_uniforms = rng.random(len(self.uniforms))

    def drafting(self, u_index: np.ndarray, category: np.ndarray) -> np.ndarray:
        """Whether the decode steps with these uniform indices carried drafts (same shape)."""
        if self.draft_uniforms is None:
            return np.ones(np.shape(u_index), dtype=bool)
        return self.draft_uniforms[u_index] < self.f[category]

    def _plan_sends(self, burstiness: float) -> None:
        need = -(-(self.prompt + self.out + self.lookahead) // self.size)
        for i in np.flatnonzero(need > self.kv_blocks):
            self.errors[int(i)] = (f"needs {int(need[i]) * self.size} KV tokens; the cache holds "
                                   f"{self.kv_blocks * self.size}")
        live = [i for i in range(len(self.out)) if i not in self.errors]
        times = send_times(self.requests, self.load, burstiness, self.sim.seed)
        if times is None:                                  # closed loop: workers send as others finish
            self.send[list(self.errors)] = 0.0
            self.arrivals, self.pending = None, deque(live)
            for _ in range(min(int(self.load.value), len(live))):
                self._send(self.pending.popleft(), 0.0)
            return
        self.send[list(self.errors)] = [times[i] if times[i] < self.duration else np.nan for i in self.errors]
        self.arrivals = sorted((times[i], i) for i in live if times[i] < self.duration)
        self.next_arrival = 0

    def _send(self, i: int, time: float) -> None:
        self.send[i] = time
        self.waiting.append(i)

    def _admit_arrivals(self) -> None:
        while self.arrivals is not None and self.next_arrival < len(self.arrivals):
            time, i = self.arrivals[self.next_arrival]
            if time > self.now:
                return
            self.occupancy += self.now - time          # in the system since it arrived mid-step
            self._send(i, time)
            self.next_arrival += 1

    def _next_arrival_time(self) -> float | None:
        if self.arrivals is None or self.next_arrival >= len(self.arrivals):
            return None
        return self.arrivals[self.next_arrival][0]

    def _arrival_that_matters(self) -> float | None:
        """The next arrival time, if that arrival could be admitted at once (nobody queued ahead
        of it, room in the batch); otherwise only finishes can change what the server does."""
        if self.waiting or len(self.run_idx) >= self.server.max_num_seqs:
            return None
        return self._next_arrival_time()

    def _advance(self, until: float, extra: int = 0) -> None:
        self.occupancy += (len(self.run_idx) + len(self.waiting) + extra) * (until - self.now)
        self.now = until

    def simulate(self) -> None:
        while True:
            self._admit_arrivals()
            if self.waiting and self._prefill():
                continue
            if len(self.run_idx):
                self._decode()
                continue
            upcoming = self._next_arrival_time()
            if upcoming is None:
                return
            self._advance(max(upcoming, self.now))

    def _blocks(self, context: np.ndarray, slots: int) -> int:
        """KV blocks for these sequences with `slots` new tokens each (rounded up per sequence)."""
        return int(((context + slots + self.size - 1) // self.size).sum())

    def _fits(self, context_of, total: int, batch: int, slots: int, limit: int) -> bool:
        """Do the blocks fit under `limit`? First the cheap bound: the sum over sequences of
        ceil((x + slots) / size) is at most (sum of x + n (slots + size - 1)) // size."""
        if (total + batch * (slots + self.size - 1)) // self.size <= limit:
            return True
        return self._blocks(context_of(), slots) <= limit

    def _prefill(self) -> bool:
        """Admit waiting requests in order while they fit; one prefill step for them all."""
        batch = len(self.run_idx)
        reserve = int(self.server.watermark * self.kv_blocks) if batch else 0
        total = self.ctx_sum
        admitted, new_blocks, tokens = [], 0, 0
        while self.waiting and batch + len(admitted) < self.server.max_num_seqs:
            i = self.waiting[0]
            length = int(self.prompt[i] + self.generated[i])     # a preempted request recomputes its output too
            need = -(-(length + self.lookahead) // self.size)
            limit = self.kv_blocks - reserve - new_blocks - need
            if (admitted and tokens + length > self.server.max_num_batched_tokens) or not self._fits(
                    lambda: self.run_ctx, total, batch, self.lookahead, limit):
                break
            self.waiting.popleft()
            admitted.append((i, length))
            new_blocks, tokens = new_blocks + need, tokens + length
        if not admitted:
            return False
        lengths = [length for _, length in admitted]
        duration = self.cost.prefill_time(lengths) + self.arm.draft.prefill_time(lengths)
        self._advance(self.now + duration, extra=len(admitted))   # out of the queue, not yet running
        self.prefill_steps += 1
        self._start_running(admitted)
        return True

    def _start_running(self, admitted: list[tuple[int, int]]) -> None:
        rows = []
        for i, length in admitted:
            if np.isnan(self.first_token[i]):
                self.first_token[i] = self.now
            self.segments[i].append(("p", self.now))
            self.generated[i] += 1
            if self.generated[i] >= self.out[i]:
                self._finish(i)
            else:
                self.open_step[i] = self.decode_steps
                rows.append((i, length, self.out[i] - self.generated[i], self.u_offset[i] + self.steps_done[i]))
        if rows:
            columns = np.array(rows, dtype=np.int64).T
            self.run_idx, self.run_ctx, self.run_rem, self.run_u = (
                np.concatenate((old, new)) for old, new in
                zip((self.run_idx, self.run_ctx, self.run_rem, self.run_u), columns))
            self.run_p = np.concatenate((self.run_p, self.p[self.cat[columns[0]]]))
            self.ctx_sum += int(columns[1].sum())
        self._note_peak(lambda: self.run_ctx, self.ctx_sum, self.lookahead)

    def _note_peak(self, context_of, total: int, slots: int) -> None:
        """Track the most KV blocks held (exact; skipped when even the bound cannot beat the peak)."""
        batch = len(self.run_idx)
        if (total + batch * (slots + self.size - 1)) // self.size > self.peak_blocks:
            self.peak_blocks = max(self.peak_blocks, self._blocks(context_of(), slots))

    def _finish(self, i: int) -> None:
        self.finish[i] = self.now
        if self.arrivals is None and self.pending and self.now < self.duration:
            self._send(self.pending.popleft(), self.now)

    def recorded(self) -> np.ndarray:
        """[requests] True for those evaluate would have recorded: sent, and not cut off."""
        sent = ~np.isnan(self.send)
        limit = DRAIN_FACTOR * self.duration
        wave = int(self.load.value) if self.arrivals is None else 0
        ended = np.where(np.isnan(self.finish), self.send, self.finish)       # errors end when sent
        if np.sum(sent & (ended <= limit)) < min(wave, int(sent.sum())):
            return sent                                                       # the first wave is waited for
        return sent & (ended <= limit)

    def _preempt_newest(self) -> None:
        i = int(self.run_idx[-1])
        self.segments[i].append(("d", int(self.open_step[i]), self.decode_steps))
        self.generated[i] = self.out[i] - self.run_rem[-1]
        self.steps_done[i] = self.run_u[-1] - self.u_offset[i]
        self.ctx_sum -= int(self.run_ctx[-1])
        self.run_idx, self.run_ctx, self.run_rem, self.run_u, self.run_p = (
            a[:-1] for a in (self.run_idx, self.run_ctx, self.run_rem, self.run_u, self.run_p))
        self.waiting.appendleft(i)
        self.preemptions += 1

    def _decode(self) -> None:
        batch = len(self.run_idx)
        k = self.arm.k_for(batch)
        if not self._fits(lambda: self.run_ctx, self.ctx_sum, batch, k + 1, self.kv_blocks):
            self._preempt_newest()
        elif k == 0:
            self._decode_plain(batch)
        else:
            self._decode_speculative(batch, k)

    def _decode_plain(self, batch: int) -> None:
        """One token per sequence per step: contexts grow by 1, so the run is in closed form."""
        first_finish = int(self.run_rem.min())
        width = min(first_finish, MAX_STEPS_PER_EVENT)
        total = self.ctx_sum
        if not self._fits(lambda: self.run_ctx + width - 1, total + batch * (width - 1), batch, 1, self.kv_blocks):
            width = self._steps_that_fit(lambda j: self.run_ctx + j, 0, width)
        ends = self.now + np.cumsum(self.cost.step_times(batch, 1, total + batch * np.arange(width)))
        steps = self._stop_for_arrival(ends, width)
        self._note_peak(lambda: self.run_ctx + steps - 1, total + batch * (steps - 1), 1)
        self._commit(steps, 0, steps, batch * steps, ends[:steps], finishing=steps == first_finish)

    def _decode_speculative(self, batch: int, k: int) -> None:
        width = self._horizon(batch, k)
        tokens, drafted = self._draw_tokens(k, width)              # [batch, width]
        emitted = np.cumsum(tokens, axis=1)
        context = self.run_ctx[:, None] + (emitted - tokens)       # [batch, width] KV cached before each step
        # emitted grows along each row: the count of steps still short of run_rem is the finishing step
        first_finish = int((emitted < self.run_rem[:, None]).sum(axis=1).min()) + 1
        width = min(width, first_finish)
        last = context[:, width - 1]
        if not self._fits(lambda: last, int(last.sum()), batch, k + 1, self.kv_blocks):
            width = self._steps_that_fit(lambda j: context[:, j], k, width)
        total = context[:, :width].sum(axis=0)
        budget = self.arm.draft.kv_budget
        capped = total if budget is None else np.minimum(context[:, :width], budget).sum(axis=0).astype(float)
        times = (self._verify_times(batch, k, total, drafted[:, :width])
                 + self.arm.draft.draft_times(batch, k, total, capped) + self.arm.overhead_s)
        ends = self.now + np.cumsum(times)
        steps = self._stop_for_arrival(ends, width)
        self._note_peak(lambda: context[:, steps - 1], int(total[steps - 1]), k + 1)
        gained = np.minimum(emitted[:, steps - 1], self.run_rem)
        self._commit(steps, k, gained, int(gained.sum()), ends[:steps], finishing=steps == first_finish)

    def _verify_times(self, batch: int, k: int, total: np.ndarray, drafted: np.ndarray) -> np.ndarray:
        """Verification steps where only some sequences drafted: their time goes linearly from a
        plain step (no one drafted) to a full one (all verify 1 + k tokens) with the share that did."""
        full = self.cost.step_times(batch, k + 1, total)
        if self.draft_uniforms is None:
            return full
        plain = self.cost.step_times(batch, 1, total)
        return plain + drafted.mean(axis=0) * (full - plain)

    def _steps_that_fit(self, context_at, k: int, width: int) -> int:
        """How many steps fit: contexts only grow, so KV need is monotone in the step; bisect."""
        low, high = 0, width - 1                                   # step 0 fits; step width - 1 does not
        while low + 1 < high:
            mid = (low + high) // 2
            if self._blocks(context_at(mid), k + 1) > self.kv_blocks:
                high = mid
            else:
                low = mid
        return low + 1

    def _horizon(self, batch: int, k: int) -> int:
        """Steps to draw: up to the first possible finish (every step emits >= 1 token), and when
        an arrival could be admitted, up to a bound on the steps before it arrives."""
        width = int(min(self.run_rem.min(), MAX_STEPS_PER_EVENT))
        upcoming = self._arrival_that_matters()
        if upcoming is not None:
            # the latest step's duration estimates this one's; a wrong guess only ends the run early
            if self.last_step <= 0:
                self.last_step = float(self.cost.step_times(batch, k + 1, [float(self.ctx_sum)])[0])
            width = min(width, max(1, int((upcoming - self.now) / self.last_step) + 2))
        return width

    def _draw_tokens(self, k: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens each step emits and whether it drafted, both [batch, width]."""
        index = self.run_u[:, None] + np.arange(width)             # [batch, width]
        accepted = (self.uniforms[index][:, :, None] < self.run_p[:, None, :k]).sum(axis=2)
        drafted = self.drafting(index, self.cat[self.run_idx][:, None])
        return 1 + accepted * drafted, drafted

    def _stop_for_arrival(self, ends: np.ndarray, width: int) -> int:
        upcoming = self._arrival_that_matters()
        if upcoming is None:
            return width
        return max(1, min(width, int(np.searchsorted(ends, upcoming)) + 1))

    def _commit(self, steps: int, k: int, gained, gained_total: int, ends, finishing: bool) -> None:
        """Apply `steps` decode steps: each row emitted `gained` tokens in them (an array, or one
        number for all); `finishing` says whether any row may have reached its length."""
        self.run_ctx = self.run_ctx + gained
        self.run_rem = self.run_rem - gained
        self.ctx_sum += gained_total
        if self.max_k:
            self.run_u = self.run_u + steps
        self.last_step = float(ends[-1] - ends[-2]) if len(ends) > 1 else float(ends[-1] - self.now)
        self.step_ends.append(ends)
        self.step_k.append((k, steps))
        self.decode_steps += steps
        self._advance(float(ends[-1]))
        if finishing:
            self._retire(self.run_rem == 0)

    def _retire(self, finished: np.ndarray) -> None:
        if not finished.any():
            return
        for i in self.run_idx[finished]:
            self.generated[i] = self.out[i]
            self.segments[i].append(("d", int(self.open_step[i]), self.decode_steps))
            self._finish(int(i))
        self.ctx_sum -= int(self.run_ctx[finished].sum())
        keep = ~finished
        self.run_idx, self.run_ctx, self.run_rem, self.run_u, self.run_p = (
            a[keep] for a in (self.run_idx, self.run_ctx, self.run_rem, self.run_u, self.run_p))
