"""Load generation: closed-loop concurrency, open-loop rate, trace replay.

  concurrency c  c workers, each sends its next request when the previous one ends
  rate r         open loop: arrivals with mean gap 1/r; gaps ~ Gamma(shape=b, mean=1/r)
                 where b is the burstiness factor: b = 1 is a Poisson process, b < 1
                 burstier, b > 1 more regular
  trace s        open loop at the trace's own arrival times divided by s (s = 2 replays
                 twice as fast)
Every point is bounded by a request count and optionally a duration: no request is
sent after `duration` seconds; those in flight finish, up to the cut-off below.
"""

import asyncio
import dataclasses
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from specwise.bench.inputs.request import WorkloadRequest
from specwise.errors import ConfigError

# --duration stops new requests; those still running at DRAIN_FACTOR x duration are cut off
# (cancelled, not recorded, counted in run.json "cut_off"), so a point's time stays bounded.
# Exception: a closed-loop point always measures its first wave (`concurrency` requests),
# each bounded by the request timeout, so a slow target still gets a figure at every level.
# The runner (measured) and the simulator (on paper) both follow this rule.
DRAIN_FACTOR = 2.0

LOAD_KINDS = ("concurrency", "rate", "trace")
Send = Callable[[WorkloadRequest], Awaitable[None]]


@dataclass(frozen=True)
class LoadPoint:
    kind: str
    value: float

    def label(self) -> str:
        if self.kind == "concurrency":
            return f"concurrency {self.value:g}"
        if self.kind == "rate":
            return f"{self.value:g} req/s"
        return f"trace x{self.value:g}"


def parse_values(text: str, flag: str, integer: bool = False) -> list[float]:
    """`"1,2,4"` -> [1, 2, 4]; every value must be > 0."""
    values = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = int(part) if integer else float(part)
        except ValueError:
            kind = "integers" if integer else "numbers"
            raise ConfigError(f"{flag}: expected comma-separated {kind}, got {part!r}") from None
        if value <= 0:
            raise ConfigError(f"{flag}: values must be > 0, got {part}")
        values.append(value)
    if not values:
        raise ConfigError(f"{flag}: give at least one value")
    return values


def take(workload: list[WorkloadRequest], count: int) -> list[WorkloadRequest]:
    """`count` requests cycling through the workload; repeats get ids like `chat-01#2`."""
    taken = []
    for index in range(count):
        base = workload[index % len(workload)]
        repeat = index // len(workload)
        request_id = base.request_id if repeat == 0 else f"{base.request_id}#{repeat}"
        taken.append(dataclasses.replace(base, request_id=request_id))
    return taken


def gamma_arrivals(count: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Send offsets (seconds); the first request goes at 0."""
    rng = random.Random(seed)
    shape, scale = burstiness, 1.0 / (rate * burstiness)
    offsets, now = [], 0.0
    for _ in range(count):
        offsets.append(now)
        now += rng.gammavariate(shape, scale)
    return offsets


def trace_arrivals(requests: list[WorkloadRequest], time_scale: float) -> list[float]:
    return [(request.arrival_time or 0.0) / time_scale for request in requests]


async def closed_loop(requests: list[WorkloadRequest], concurrency: int, send: Send,
                      duration: float | None = None, clock=time.perf_counter) -> None:
    start = clock()
    pending = iter(requests)

    async def worker():
        for request in pending:
            if duration is not None and clock() - start >= duration:
                return
            await send(request)

    await asyncio.gather(*(worker() for _ in range(int(concurrency))))


async def open_loop(requests: list[WorkloadRequest], offsets: list[float], send: Send,
                    duration: float | None = None, clock=time.perf_counter) -> None:
    start = clock()
    tasks = []
    try:
        for request, offset in zip(requests, offsets):
            if duration is not None and offset >= duration:
                break
            delay = start + offset - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(request)))
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
