"""Runs a Plan against the arms: load point by load point, each point in rounds, every
arm serving the same requests in the same order (bench/load/schedule.py), appending
every finished request to requests.jsonl as it ends (an interrupted run keeps them).

Start: every target starts (the HTTP client opens, the endpoint is checked), then each
arm sends its warm-up requests one at a time (recorded with warmup=True, excluded from
figures). Then for each load point, round after round, each arm in the schedule's order
is activated (the in-process engine switches its drafter; an endpoint needs nothing; a
launched server in blocks is started, then warmed up) and serves the round's requests.

Bounds, per arm and load point: --duration D gives each arm D seconds of sending over
the point's rounds; requests still running when its time there reaches 2D are cut off
(counted in run.json "cut_off"). A closed-loop point always measures its first wave.
No round starts once an arm's time is spent. In blocks (launched servers, one at a time) each
block sends for at most D / blocks seconds, so the blocks share an arm's time. With --precision, rounds go on past the
planned requests (the order cycles) until every compared ratio's interval is narrow
enough (bench/stats/precision.py), or the time or --num-requests cap is reached.
With a schedule's settle S, an arm that serves right after another first waits S seconds (a
server sharing the machine can keep a core busy after its last request; the pause is not
counted in any arm's time). Server-side speculative counters are read around each point
(run.json "server_acceptance"; "requests_agree": whether the responses' own per-request counters
sum to the same drafts, draft tokens and accepted tokens). In blocks a restart zeroes them, so
they are read around each block instead (after its warm-up, before its server stops) and the
blocks' differences summed per point ("blocks": how many; "blocks_unread": blocks whose
server could not be read, when any, and then no comparison is made).
"""

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Callable

from specwise.bench.load.arrivals import DRAIN_FACTOR, LoadPoint, closed_loop, open_loop, take
from specwise.bench.load.measure import Slot, Tokenizer, measure
from specwise.bench.load.metrics import point_metrics, server_acceptance_stats
from specwise.bench.load.plan import Plan
from specwise.bench.load.progress import View
from specwise.bench.load.schedule import Schedule, rounds
from specwise.bench.load.sessions import Sessions
from specwise.bench.results import RecordWriter, RequestRecord, write_run_info
from specwise.bench.load.slo import SLO
from specwise.bench.load.targets.base import Target
from specwise.bench.load.targets.prometheus import add, difference

MAX_REQUESTS = 100_000          # --precision without --num-requests: the time cap decides
PrecisionGoal = Callable[[dict[str, list[RequestRecord]]], bool]    # records by arm -> enough?


class Runner:
    def __init__(self, plan: Plan, targets: list[Target], results_dir: Path, run_info: dict, view: View,
                 warmup: int, timeout: float, slo: SLO, tokenizer: Tokenizer | None = None,
                 schedule: Schedule | None = None, precision: PrecisionGoal | None = None):
        self.plan, self.targets, self.results_dir = plan, targets, Path(results_dir)
        self.run_info, self.view, self.warmup, self.timeout = run_info, view, warmup, timeout
        self.slo, self.tokenizer = slo, tokenizer
        self.schedule, self.precision = schedule or Schedule("interleaved"), precision
        self.run_start = 0.0
        self.writer: RecordWriter | None = None
        self.sessions = Sessions()      # multi-turn sessions: a turn carries the previous answer
        self.last_arm: str | None = None    # the arm that served last (the schedule's settle)

    async def run(self) -> None:
        self.run_start = time.perf_counter()
        write_run_info(self.results_dir, self.run_info)
        started = []
        with RecordWriter(self.results_dir) as writer:
            self.writer = writer
            try:
                for target in self.targets:
                    await target.start()
                    started.append(target)
                # blocks: the first arm warms up last, so its server is up for the first round
                first_up = reversed(self.targets) if self.schedule.kind == "blocks" else self.targets
                for target in first_up:
                    self.view.arm_started(target.name)
                    await target.activate()
                    await self._warm_up(target)
                for point in self.plan.loads:
                    await self._run_point(point)
            finally:
                for target in started:
                    await target.close()

    async def _warm_up(self, target: Target) -> None:
        if not self.warmup or not self.plan.loads:
            return
        first = self.plan.loads[0]
        slot = Slot(first.kind, first.value, self.run_start, warmup=True)
        await self._settle(target)
        for request in take(self.plan.workload, self.warmup):
            request = dataclasses.replace(request, request_id=f"warmup:{request.request_id}")
            self.writer.write(await measure(target, request, slot, self.timeout, self.tokenizer))

    async def _settle(self, target: Target) -> None:
        """The schedule's pause before `target` serves, when the last to serve was another arm."""
        if self.schedule.settle and self.last_arm not in (None, target.name):
            await asyncio.sleep(self.schedule.settle)
        self.last_arm = target.name

    def _round(self, point: LoadPoint, start: int, end: int):
        """Requests [start:end] of the point (the order cycles past the planned ones), and for
        open-loop points their send offsets re-based to the round's first."""
        every = self.plan.requests(point) if point.kind == "trace" else take(self.plan.workload, end)
        if point.kind == "concurrency":
            return every[start:end], None
        offsets = self.plan.offsets(point, every[:end])
        return every[start:end], [offset - offsets[start] for offset in offsets[start:end]]

    async def _run_point(self, point: LoadPoint) -> None:
        planned = self.plan.requests(point)
        extend = self.precision is not None and point.kind != "trace"
        cap = (self.plan.num_requests or MAX_REQUESTS) if extend else len(planned)
        size = self.schedule.size(point, len(planned))
        blocks = self.schedule.kind == "blocks"
        state = {t.name: {"used": 0.0, "finished": [], "cut_off": 0, "counters": None, "blocks": 0, "unread": 0}
                 for t in self.targets}
        before = {t.name: None if blocks else await t.server_acceptance() for t in self.targets}
        for index, (start, end) in enumerate(rounds(cap, size)):
            requests, offsets = self._round(point, start, end)
            for target in self.schedule.arm_order(index, self.targets):
                if await target.activate():         # a launched server (re)started: warm it up again
                    await self._warm_up(target)
                block_start = await target.server_acceptance() if blocks else None
                await self._run_round(target, point, index, requests, offsets, state[target.name])
                if blocks:
                    self._count_block(state[target.name], block_start, await target.server_acceptance())
            if self._point_done(state, end, len(planned)):
                break
        for target in self.targets:
            await self._finish_point(target, point, state[target.name], before[target.name])

    @staticmethod
    def _count_block(arm: dict, start, end) -> None:
        """Blocks: add one block's counter difference to the point's (a server that cannot be read
        at either end leaves the block unread)."""
        if start is None or end is None:
            arm["unread"] += 1
            return
        arm["counters"] = add(arm["counters"], difference(start, end))
        arm["blocks"] += 1

    def _point_done(self, state: dict, sent: int, planned: int) -> bool:
        duration = self.plan.duration
        if duration is not None and any(arm["used"] >= duration for arm in state.values()):
            return True
        if self.precision is None:
            return sent >= planned
        return self.precision({name: arm["finished"] for name, arm in state.items()})

    async def _run_round(self, target: Target, point: LoadPoint, index: int, requests, offsets, arm: dict) -> None:
        duration = self.plan.duration
        send_limit = None if duration is None else duration - arm["used"]
        if send_limit is not None and send_limit <= 0:
            return
        if send_limit is not None and self.schedule.kind == "blocks":
            send_limit = min(send_limit, duration / self.schedule.blocks)   # every block gets its share
        await self._settle(target)
        await target.reconnect()
        self.view.point_started(target.name, point, len(requests))
        slot = Slot(point.kind, point.value, self.run_start, round=index)
        finished: list[RequestRecord] = []
        started = 0

        async def send(request):
            nonlocal started
            started += 1
            request = await self.sessions.prepare(target.name, point, request)
            answer = self.sessions.recorder(target)
            record = await measure(answer, request, slot, self.timeout, self.tokenizer)
            self.sessions.finish(target.name, point, request, answer.text if record.error is None else None)
            self.writer.write(record)
            finished.append(record)
            self.view.request_done(record)

        began = time.perf_counter()
        if point.kind == "concurrency":
            load = closed_loop(requests, int(point.value), send, send_limit)
        else:
            load = open_loop(requests, offsets, send, send_limit)
        task = asyncio.ensure_future(load)
        limit = None if duration is None else DRAIN_FACTOR * duration - arm["used"]
        await asyncio.wait({task}, timeout=limit)
        wave = int(point.value) if point.kind == "concurrency" and index == 0 else 0
        if not task.done() and len(finished) < min(wave, started):
            await asyncio.wait({task}, timeout=self.timeout)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            arm["cut_off"] += started - len(finished)
        arm["used"] += time.perf_counter() - began
        arm["finished"].extend(finished)

    async def _finish_point(self, target: Target, point: LoadPoint, arm: dict, before) -> None:
        if arm["cut_off"]:
            self._note(target, point, "cut_off", {"requests": arm["cut_off"]})
        metrics = point_metrics(arm["finished"], self.slo)
        blocks = self.schedule.kind == "blocks"
        counters = arm["counters"] if blocks else difference(before, await target.server_acceptance())
        if counters is not None:
            values = dataclasses.asdict(counters)
            if blocks:
                values["blocks"] = arm["blocks"]
                if arm["unread"]:
                    values["blocks_unread"] = arm["unread"]
            if metrics.acceptance is not None and counters.drafts is not None and not arm["unread"]:
                # per-request counters (the responses) against the server's own over the same point
                mine = metrics.acceptance
                values["requests_agree"] = (mine.drafts, mine.draft_tokens, mine.accepted_tokens) == (
                    counters.drafts, counters.draft_tokens, counters.accepted_tokens)
            entry = self._note(target, point, "server_acceptance", values)
            metrics.acceptance = metrics.acceptance or server_acceptance_stats(entry)
        self.view.point_done(target.name, point, metrics, arm["cut_off"])

    def _note(self, target: Target, point: LoadPoint, key: str, values: dict) -> dict:
        """Append a per-point entry to run.json[key] (rewritten at once: it survives an interrupt)."""
        entry = dict(values, arm=target.name, load_kind=point.kind, load_value=point.value)
        self.run_info.setdefault(key, []).append(entry)
        write_run_info(self.results_dir, self.run_info)
        return entry
