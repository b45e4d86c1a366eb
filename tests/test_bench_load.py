"""Load generation: arrivals, closed and open loops, bounds."""

import asyncio
import statistics
import time

import pytest

from specwise.bench.load.arrivals import closed_loop, gamma_arrivals, open_loop, parse_values, take, trace_arrivals
from specwise.bench.inputs.request import WorkloadRequest
from specwise.errors import ConfigError

WORKLOAD = [WorkloadRequest(f"q{i}", "chat", prompt="p") for i in range(3)]


def test_take_cycles_with_distinct_ids():
    assert [r.request_id for r in take(WORKLOAD, 7)] == ["q0", "q1", "q2", "q0#1", "q1#1", "q2#1", "q0#2"]
    assert WORKLOAD[0].request_id == "q0"


def test_poisson_and_bursty_arrivals():
    poisson = gamma_arrivals(4000, rate=5.0, burstiness=1.0, seed=1)
    gaps = [b - a for a, b in zip(poisson, poisson[1:])]
    assert poisson[0] == 0.0
    assert statistics.fmean(gaps) == pytest.approx(0.2, rel=0.05)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.08)  # exponential: CV 1
    bursty = gamma_arrivals(4000, rate=5.0, burstiness=0.25, seed=1)
    bursty_gaps = [b - a for a, b in zip(bursty, bursty[1:])]
    assert statistics.fmean(bursty_gaps) == pytest.approx(0.2, rel=0.1)                    # same mean rate
    assert statistics.stdev(bursty_gaps) / statistics.fmean(bursty_gaps) == pytest.approx(2.0, rel=0.1)
    assert gamma_arrivals(5, 1.0, 1.0, seed=3) == gamma_arrivals(5, 1.0, 1.0, seed=3)


def test_trace_arrivals_scale_time():
    requests = [WorkloadRequest("a", "trace", arrival_time=0.0), WorkloadRequest("b", "trace", arrival_time=3.0)]
    assert trace_arrivals(requests, 2.0) == [0.0, 1.5]


def test_parse_values():
    assert parse_values("1, 2,4", "--concurrency", integer=True) == [1, 2, 4]
    assert parse_values("0.5,2", "--rate") == [0.5, 2.0]
    for bad in ("", "1,x", "0", "1.5"):
        with pytest.raises(ConfigError, match="--concurrency"):
            parse_values(bad, "--concurrency", integer=True)


class Recorder:
    def __init__(self, hold=0.01):
        self.hold, self.in_flight, self.peak, self.sent = hold, 0, 0, []

    async def send(self, request):
        self.sent.append((request.request_id, time.perf_counter()))
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(self.hold)
        self.in_flight -= 1


def test_closed_loop_keeps_exactly_c_in_flight():
    recorder = Recorder()
    asyncio.run(closed_loop(take(WORKLOAD, 20), 4, recorder.send))
    assert recorder.peak == 4 and len(recorder.sent) == 20
    assert [rid for rid, _ in recorder.sent[:4]] == ["q0", "q1", "q2", "q0#1"]


class FakeClock:
    """Seconds that pass only when a test moves them: what is sent when does not depend on the machine."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_duration_stops_new_requests():
    clock, sent = FakeClock(), []

    async def send(request):                      # two workers, each request 0.25 s: the clock moves
        sent.append(clock())                      # 0.125 s per request sent
        clock.now += 0.125
        await asyncio.sleep(0)                    # the other worker's turn

    asyncio.run(closed_loop(take(WORKLOAD, 1000), 2, send, duration=1.0, clock=clock))
    assert sent == [0.125 * i for i in range(8)]  # sent until 1 s had passed, none after, of 1000


def test_open_loop_sends_at_the_offsets_without_waiting_for_answers(monkeypatch):
    clock, sent = FakeClock(), []
    real_sleep = asyncio.sleep

    async def sleep(seconds):                     # open_loop's waits move the fake clock, after the
        await real_sleep(0)                       # requests already sent have started
        clock.now += seconds

    monkeypatch.setattr(asyncio, "sleep", sleep)

    async def main():
        all_sent = asyncio.Event()

        async def send(request):                  # answers only once all three were sent
            sent.append((request.request_id, clock()))
            if len(sent) == 3:
                all_sent.set()
            await asyncio.wait_for(all_sent.wait(), 10)     # a loop that waited for answers fails here

        await open_loop(take(WORKLOAD, 3), [0.0, 0.05, 0.1], send, clock=clock)

    asyncio.run(main())
    assert sent == [("q0", 0.0), ("q1", 0.05), ("q2", 0.1)]


def test_open_loop_duration_bound():
    recorder = Recorder(hold=0.0)
    asyncio.run(open_loop(take(WORKLOAD, 5), [0.0, 0.01, 0.02, 5.0, 6.0], recorder.send, duration=1.0))
    assert len(recorder.sent) == 3
