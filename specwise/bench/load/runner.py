"""Runs a Plan against the arms, one arm after another, appending every finished request
to requests.jsonl as it ends (an interrupted run keeps all of them).

Per arm: start the target (switch the engine's drafter, open the HTTP client), send the
warm-up requests one at a time (recorded with warmup=True, excluded from figures), then
each load point. Server-side speculative counters are read before and after each point
and their difference is stored in run.json "server_acceptance".
"""

import asyncio
import dataclasses
import time
from pathlib import Path

from specwise.bench.load.arrivals import DRAIN_FACTOR, LoadPoint, closed_loop, open_loop, take
from specwise.bench.load.measure import Slot, Tokenizer, measure
from specwise.bench.load.metrics import point_metrics, server_acceptance_stats
from specwise.bench.load.plan import Plan
from specwise.bench.load.progress import View
from specwise.bench.results import RecordWriter, RequestRecord, write_run_info
from specwise.bench.load.slo import SLO
from specwise.bench.load.targets.base import Target
from specwise.bench.load.targets.prometheus import difference


class Runner:
    def __init__(self, plan: Plan, targets: list[Target], results_dir: Path, run_info: dict, view: View,
                 warmup: int, timeout: float, slo: SLO, tokenizer: Tokenizer | None = None):
        self.plan, self.targets, self.results_dir = plan, targets, Path(results_dir)
        self.run_info, self.view, self.warmup, self.timeout = run_info, view, warmup, timeout
        self.slo, self.tokenizer = slo, tokenizer
        self.run_start = 0.0
        self.writer: RecordWriter | None = None

    async def run(self) -> None:
        self.run_start = time.perf_counter()
        write_run_info(self.results_dir, self.run_info)
        with RecordWriter(self.results_dir) as writer:
            self.writer = writer
            for target in self.targets:
                await self._run_arm(target)

    async def _run_arm(self, target: Target) -> None:
        self.view.arm_started(target.name)
        await target.start()
        try:
            await self._warm_up(target)
            for point in self.plan.loads:
                await self._run_point(target, point)
        finally:
            await target.close()

    async def _warm_up(self, target: Target) -> None:
        if not self.warmup or not self.plan.loads:
            return
        first = self.plan.loads[0]
        slot = Slot(first.kind, first.value, self.run_start, warmup=True)
        for request in take(self.plan.workload, self.warmup):
            request = dataclasses.replace(request, request_id=f"warmup:{request.request_id}")
            self.writer.write(await measure(target, request, slot, self.timeout, self.tokenizer))

    async def _run_point(self, target: Target, point: LoadPoint) -> None:
        requests = self.plan.requests(point)
        self.view.point_started(target.name, point, self.plan.expected_requests(point))
        slot = Slot(point.kind, point.value, self.run_start)
        finished: list[RequestRecord] = []
        started = 0

        async def send(request):
            nonlocal started
            started += 1
            record = await measure(target, request, slot, self.timeout, self.tokenizer)
            self.writer.write(record)
            finished.append(record)
            self.view.request_done(record)

        before = await target.server_acceptance()
        if point.kind == "concurrency":
            load = closed_loop(requests, int(point.value), send, self.plan.duration)
        else:
            load = open_loop(requests, self.plan.offsets(point, requests), send, self.plan.duration)
        task = asyncio.ensure_future(load)
        limit = None if self.plan.duration is None else DRAIN_FACTOR * self.plan.duration
        await asyncio.wait({task}, timeout=limit)
        wave = int(point.value) if point.kind == "concurrency" else 0
        if not task.done() and len(finished) < min(wave, started):
            await asyncio.wait({task}, timeout=self.timeout)
        cut_off = 0
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            cut_off = started - len(finished)
            self._note(target, point, "cut_off", {"requests": cut_off})
        metrics = point_metrics(finished, self.slo)
        counters = difference(before, await target.server_acceptance())
        if counters is not None:
            entry = self._note(target, point, "server_acceptance", dataclasses.asdict(counters))
            metrics.acceptance = metrics.acceptance or server_acceptance_stats(entry)
        self.view.point_done(target.name, point, metrics, cut_off)

    def _note(self, target: Target, point: LoadPoint, key: str, values: dict) -> dict:
        """Append a per-point entry to run.json[key] (rewritten at once: it survives an interrupt)."""
        entry = dict(values, arm=target.name, load_kind=point.kind, load_value=point.value)
        self.run_info.setdefault(key, []).append(entry)
        write_run_info(self.results_dir, self.run_info)
        return entry
