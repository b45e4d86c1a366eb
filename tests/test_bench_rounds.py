"""The paired, interleaved run: request order, rounds, arm order, drift, --precision, mixed arms.

FakeTarget sleeps per token; its speed can drift linearly with the number of requests
the whole run has served (a machine slowing down), whichever arm serves them. Given a
VirtualClock (installed as the clock `measure` reads), its tokens take virtual time
instead, with an optional seeded jitter: the measured figures are then the same on any
machine, however loaded.
"""

import asyncio
import io
import json
import random
import time

import pytest

from specwise.bench.config import EvaluateConfig
from specwise.bench.inputs.request import WorkloadRequest
from specwise.bench.load.arms import ArmSpec
from specwise.bench.load import measure as measure_module
from specwise.bench.load.arrivals import LoadPoint
from specwise.bench.load.order import seeded_order
from specwise.bench.load.plan import Plan
from specwise.bench.load.progress import PlainView
from specwise.bench.load.runner import Runner
from specwise.bench.load.schedule import Schedule, choose_schedule, rounds
from specwise.bench.load.slo import SLO
from specwise.bench.load.targets.base import TokenChunk, Usage
from specwise.bench.report.summary import summarize
from specwise.bench.results import read_records
from specwise.bench.stats.precision import PrecisionCheck
from specwise.errors import ConfigError
from specwise.models.capabilities import compute_dtype, cpu_capabilities, linear_path
from capability_marks import cpu_kernels

WORKLOAD = [WorkloadRequest(f"{category}-{i}", category, prompt="p", max_tokens=4)
            for category in ("code", "chat", "math") for i in range(4)]


class VirtualClock:
    """Stands in for the `time` module in bench/load/measure.py: seconds pass when a target says so."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def virtual_clock(monkeypatch):
    clock = VirtualClock()
    monkeypatch.setattr(measure_module, "time", clock)
    return clock


class FakeTarget:
    def __init__(self, name: str, served: dict, per_token: float = 0.004, speedup: float = 1.0,
                 drift: float = 0.0, clock: VirtualClock | None = None, jitter: float = 0.0):
        self.name, self.method = name, "off" if name == "off" else "ngram"
        self.served, self.per_token, self.speedup, self.drift = served, per_token, speedup, drift
        self.clock, self.jitter, self.rng = clock, jitter, random.Random(name)
        self.activations = self.reconnects = 0

    async def start(self):
        pass

    async def reconnect(self):
        self.reconnects += 1

    async def activate(self):
        self.activations += 1

    async def close(self):
        pass

    async def server_acceptance(self):
        return None

    async def stream(self, request):
        self.served["count"] += 1
        self.served["order"].append((self.name, request.request_id))
        delay = self.per_token / self.speedup * (1 + self.drift * self.served["count"])
        delay *= 1 + self.jitter * (self.rng.random() - 0.5)        # e.g. jitter 0.8: +-40%
        for _ in range(4):
            if self.clock is None:
                await asyncio.sleep(delay)
            else:
                self.clock.now += delay
                await asyncio.sleep(0)
            yield TokenChunk(self.clock.now if self.clock else time.perf_counter(), "x", 1)
        yield Usage(1, 4)


def run(tmp_path, targets, schedule, count=24, precision=None, duration=None, concurrency=1):
    plan = Plan(workload=seeded_order(WORKLOAD, 0), loads=[LoadPoint("concurrency", concurrency)],
                num_requests=count, duration=duration, burstiness=1.0, seed=0)
    info = {"tool": "evaluate", "arms": [{"name": t.name, "method": t.method} for t in targets], "baseline": "off"}
    runner = Runner(plan, targets, tmp_path, info, PlainView(io.StringIO()), warmup=0, timeout=30, slo=SLO(),
                    schedule=schedule, precision=precision)
    asyncio.run(runner.run())
    return read_records(tmp_path), info


def test_seeded_order_interleaves_categories_and_depends_on_the_seed():
    ordered = seeded_order(WORKLOAD, 0)
    assert sorted(r.request_id for r in ordered) == sorted(r.request_id for r in WORKLOAD)
    assert all(len({r.category for r in ordered[i:i + 3]}) == 3 for i in range(0, 12, 3))
    assert [r.request_id for r in seeded_order(WORKLOAD, 0)] == [r.request_id for r in ordered]
    assert [r.request_id for r in seeded_order(WORKLOAD, 1)] != [r.request_id for r in ordered]


def test_rounds_and_arm_orders():
    assert rounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    schedule = Schedule("interleaved")
    assert [schedule.arm_order(i, "AB") for i in range(4)] == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]
    assert schedule.size(LoadPoint("concurrency", 8), 100) == 16
    assert Schedule("sequential").size(LoadPoint("concurrency", 8), 100) == 100
    assert "A B | B A" in schedule.describe(["A", "B"])


def test_auto_schedule_is_sequential_only_when_switching_reloads_a_draft_model():
    off, ngram = ArmSpec("off", "off", None, 0), ArmSpec("ngram-k4", "ngram", "ngram", 4)
    draft = ArmSpec("draft-small-k4", "draft", "draft:/m", 4)
    assert choose_schedule("auto", [off, ngram]).kind == "interleaved"
    assert choose_schedule("auto", [off, draft]).kind == "sequential"
    assert choose_schedule("sequential", [off, ngram]).kind == "sequential"


def test_settle_defaults_to_a_pause_only_when_an_endpoint_shares_this_machine():
    off = ArmSpec("off", "off", None, 0)
    local, remote = (ArmSpec("vllm", "http", None, None, url=url)
                     for url in ("http://127.0.0.1:8000", "http://gpu-7:8000"))
    assert choose_schedule("auto", [off, local]).settle == 2.0
    assert choose_schedule("auto", [ArmSpec("a", "http", None, None, url="http://localhost:1"), remote]).settle == 2.0
    assert choose_schedule("auto", [off, remote]).settle == 0.0
    assert choose_schedule("auto", [local]).settle == 0.0                  # one arm: nothing to switch
    assert choose_schedule("auto", [off, local], settle=0.5).settle == 0.5


def test_every_arm_serves_the_same_requests_in_the_same_order(tmp_path):
    served = {"count": 0, "order": []}
    targets = [FakeTarget("off", served), FakeTarget("ngram-k4", served)]
    records, _ = run(tmp_path, targets, Schedule("interleaved"), count=12)
    orders = {name: [rid for arm, rid in served["order"] if arm == name] for name in ("off", "ngram-k4")}
    assert orders["off"] == orders["ngram-k4"] == [r.request_id for r in seeded_order(WORKLOAD, 0)]
    assert [r.round for r in records if r.arm == "off"] == [0] * 4 + [1] * 4 + [2] * 4
    # round 0: off first; round 1: ngram first
    firsts = [served["order"][i][0] for i in (0, 8, 16)]
    assert firsts == ["off", "ngram-k4", "off"] and targets[0].activations == 4     # 3 rounds + warm-up
    # each arm's every round starts from the same connections (targets/http.py reconnect)
    assert [t.reconnects for t in targets] == [3, 3]


def _tpot_speedup(records, info):
    return summarize(records, info).row("ngram-k4", "concurrency", 1).speedup["e2e_mean"]


def test_interleaving_cancels_a_linear_drift(tmp_path, virtual_clock):
    """Both arms are equally fast; the machine slows down 3% per request served (in virtual time)."""
    sequential = []
    for schedule, folder in ((Schedule("sequential"), "seq"), (Schedule("interleaved", round_size=4), "int")):
        served = {"count": 0, "order": []}
        targets = [FakeTarget(name, served, per_token=0.01, drift=0.03, clock=virtual_clock)
                   for name in ("off", "ngram-k4")]
        sequential.append(_tpot_speedup(*run(tmp_path / folder, targets, schedule, count=24)))
    drifted, interleaved = sequential
    # sequential: off serves requests 1-24, ngram 25-48: 1.375 / 2.095 = 0.66, the later arm ~1.5x slower
    assert drifted == pytest.approx((1 + 0.03 * 12.5) / (1 + 0.03 * 36.5))
    assert interleaved == pytest.approx(1.0, abs=0.02)


def test_precision_stops_adding_rounds_once_the_intervals_are_narrow(tmp_path, virtual_clock):
    served = {"count": 0, "order": []}
    targets = [FakeTarget("off", served, per_token=0.002, clock=virtual_clock, jitter=0.8),
               FakeTarget("ngram-k4", served, per_token=0.002, speedup=1.5, clock=virtual_clock, jitter=0.8)]
    check = PrecisionCheck("off", ["e2e_mean", "output_throughput"], 0.10, 0.95, 0)
    records, _ = run(tmp_path, targets, Schedule("interleaved", round_size=4), count=400, precision=check)
    per_arm = len([r for r in records if r.arm == "off"])
    assert 8 < per_arm < 400            # rounds added past the first intervals (8), stopped long before the cap
    assert per_arm % 4 == 0                             # whole rounds


def test_duration_caps_precision(tmp_path):
    """In real time (the runner's --duration is wall-clock): requests of >= 40 ms, 1 s per arm. The first
    round (2 requests) has the whole second, a generous bound; past it no round starts, so at most
    1 s / 40 ms + 1 = 26 requests, where the precision goal alone would never stop."""
    served = {"count": 0, "order": []}
    targets = [FakeTarget("off", served, per_token=0.01), FakeTarget("ngram-k4", served, per_token=0.01)]
    never = PrecisionCheck("off", ["e2e_mean"], 1e-9, 0.95, 0)
    records, _ = run(tmp_path, targets, Schedule("interleaved", round_size=2), count=None, precision=never,
                     duration=1.0)
    assert 2 <= len([r for r in records if r.arm == "off"]) <= 26


def test_precision_needs_a_cap_and_quick_asks_for_it():
    with pytest.raises(ConfigError, match="--precision needs a cap"):
        EvaluateConfig(precision=0.05, progress=False)
    quick = EvaluateConfig(quick=True, progress=False)
    assert quick.precision == 0.05 and quick.duration == 12.0


@cpu_kernels
def test_methods_and_endpoints_in_one_run(tmp_path, capfd):
    torch = pytest.importorskip("torch")  # noqa: F841
    from specwise.bench.evaluate import evaluate
    from specwise.config import EngineConfig
    from test_bench_http import SSEServer
    from tiny_models import tiny_checkpoint
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"prompt": f"abc abc {i}", "max_tokens": 6}) + "\n" for i in range(4)))
    with SSEServer(tokens_per_chunk=2) as server:
        config = EvaluateConfig(methods="off,ngram:1-3@2", endpoint=[f"vllm-ngram={server.url}"],
                                workload=str(workload), concurrency="2", num_requests=4, warmup=0,
                                output=str(tmp_path / "out"), progress=False)
        # compile None, as `specwise evaluate` leaves it: nothing is in the compile cache for it, so eager
        outcome = evaluate(config, EngineConfig(max_model_len=128, num_kv_blocks=128, compile=None), argv=[],
                           checkpoint=tiny_checkpoint())
    records = read_records(outcome.results_dir)
    assert {r.arm for r in records} == {"off", "ngram-1-3-k2", "vllm-ngram"}
    assert all(len([r for r in records if r.arm == arm]) == 4 for arm in ("off", "ngram-1-3-k2", "vllm-ngram"))
    run_json = json.loads((outcome.results_dir / "run.json").read_text())
    assert run_json["schedule"]["kind"] == "interleaved" and run_json["baseline"] == "off"
    # what the in-process engine ran, as the start-up line says it, is kept and shown in the report
    dtype = compute_dtype("auto", "cpu")
    assert run_json["kernels"]["dtype"] == str(dtype).removeprefix("torch.") and not run_json["kernels"]["compiled"]
    assert run_json["kernels"]["linears"] == linear_path(dtype, "none", "cpu")
    assert run_json["kernels"]["cpu"]["isa"] == cpu_capabilities().isa
    assert f"- engine: {run_json['kernels']['dtype']}, linears: {linear_path(dtype, 'none', 'cpu')}, eager" in \
        (outcome.results_dir / "summary.md").read_text()
    # and the start-up line says plainly that the eager engine is measured, and how to measure the compiled one
    err = capfd.readouterr().err
    assert "measuring the EAGER engine" in err and "add --compile" in err


def test_an_endpoint_may_not_reuse_a_method_arm_name(tmp_path):
    from specwise.bench.evaluate import evaluate
    config = EvaluateConfig(methods="off", endpoint=["off=http://127.0.0.1:9"], output=str(tmp_path / "o"),
                            progress=False)
    with pytest.raises(ConfigError, match="arm name given twice: off"):
        evaluate(config)


def test_settle_pauses_only_where_the_arm_changes(tmp_path, monkeypatch):
    """Each request records when it started and ended; with settle S the first request of an arm's
    round starts at least S after the other arm's last one ended (warm-up included), and the runner
    sleeps S exactly once per change of arm."""
    served = {"count": 0, "order": []}
    spans, pauses = [], []
    real_sleep = asyncio.sleep

    async def sleep(seconds):
        if seconds == 0.05:
            pauses.append(seconds)
        await real_sleep(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)

    class Timed(FakeTarget):
        async def stream(self, request):
            start = time.perf_counter()
            async for event in super().stream(request):
                yield event
            spans.append((self.name, start, time.perf_counter()))

    targets = [Timed("off", served, per_token=0.001), Timed("ngram-k4", served, per_token=0.001)]
    plan = Plan(workload=seeded_order(WORKLOAD, 0), loads=[LoadPoint("concurrency", 1)], num_requests=8,
                duration=None, burstiness=1.0, seed=0)
    info = {"tool": "evaluate", "arms": [{"name": t.name, "method": t.method} for t in targets], "baseline": "off"}
    schedule = Schedule("interleaved", round_size=2, settle=0.05)
    runner = Runner(plan, targets, tmp_path, info, PlainView(io.StringIO()), warmup=1, timeout=30, slo=SLO(),
                    schedule=schedule)
    asyncio.run(runner.run())
    switches = [(before, after) for before, after in zip(spans, spans[1:]) if before[0] != after[0]]
    # warm-up off, ngram; rounds of two: off off ngram ngram | ngram ngram off off | off off ngram ngram | ngram
    # ngram off off: six changes of arm (none between rounds that end and start with the same arm)
    assert [after[0] for _, after in switches] == ["ngram-k4", "off"] * 3
    assert all(after[1] - before[2] >= 0.05 for before, after in switches)
    assert len(pauses) == 6
    assert "0.05 s pause when the arm changes" in schedule.describe(["off", "ngram-k4"])
    with pytest.raises(ConfigError, match="settle"):
        EvaluateConfig(settle=-1)
