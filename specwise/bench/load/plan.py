"""What a run sends: the workload, the load points, and the requests of each point.

Every arm gets the same requests at the same point, in the same order (measurement rule:
same prompts, side by side); the order is drawn once from --seed with the categories
interleaved (bench/load/order.py), unless --order file. Default request count per point: max(4 x concurrency, 24) for a
concurrency point, 24 for a rate point, the whole trace for replay; --num-requests
and --duration bound each point.
"""

import json
from dataclasses import dataclass, field

from specwise.bench.load.arrivals import LoadPoint, gamma_arrivals, parse_values, take, trace_arrivals
from specwise.bench.load.config import LoadConfig
from specwise.bench.load.order import seeded_order
from specwise.bench.inputs.bad_rows import BadRows
from specwise.bench.inputs.suite import load_suite, parse_categories
from specwise.bench.inputs.traces import read_trace
from specwise.bench.inputs.request import WorkloadRequest
from specwise.bench.inputs.workload_file import read_workload
from specwise.errors import InputError

MIN_REQUESTS = 24


@dataclass
class Plan:
    workload: list[WorkloadRequest]
    loads: list[LoadPoint]
    num_requests: int | None
    duration: float | None
    burstiness: float
    seed: int
    info: dict = field(default_factory=dict)    # run.json "workload"

    def requests(self, point: LoadPoint) -> list[WorkloadRequest]:
        return point_requests(point, self.workload, self.num_requests)

    def offsets(self, point: LoadPoint, requests: list[WorkloadRequest]) -> list[float]:
        """Send offsets for open-loop points (rate, trace)."""
        if point.kind == "trace":
            return trace_arrivals(requests, point.value)
        return gamma_arrivals(len(requests), point.value, self.burstiness, self.seed)

    def expected_requests(self, point: LoadPoint) -> int:
        """For progress bars: the count, cut by --duration where that is predictable."""
        count = len(self.requests(point))
        if self.duration is None or point.kind == "concurrency":
            return count
        offsets = self.offsets(point, self.requests(point))
        return sum(1 for offset in offsets if offset < self.duration)


def build_plan(config: LoadConfig) -> Plan:
    workload, info = load_workload(config.workload, config.trace, config.trace_format, config.per_category,
                                   config.skip_bad_rows)
    if config.max_tokens is not None:
        for request in workload:
            request.max_tokens = min(request.max_tokens, config.max_tokens)
    if not config.trace and config.order == "seeded":
        workload = seeded_order(workload, config.seed)
    loads = load_points(config.concurrency, config.rate, config.trace, config.time_scale)
    return Plan(workload=workload, loads=loads, num_requests=config.num_requests, duration=config.duration,
                burstiness=config.burstiness, seed=config.seed, info=info)


def load_workload(workload: str, trace: str | None = None, trace_format: str | None = None,
                  per_category: int | None = None, skip_bad_rows: bool = False) -> tuple[list[WorkloadRequest], dict]:
    """--trace (a trace, or a workload file with timestamps), else --workload (suite or JSONL).

    Returns the requests (trace ones in arrival order) and run.json's "workload" entry.
    """
    bad_rows = BadRows(skip=skip_bad_rows)
    if trace and trace_format is None and _prompt_jsonl(trace):
        requests, source = read_workload(trace, bad_rows=bad_rows), f"workload replay {trace}"
        if requests[0].arrival_time is None:
            raise InputError(f"{trace}: replaying a workload file needs a 'timestamp' on every line")
    elif trace:
        requests, source = read_trace(trace, trace_format, bad_rows=bad_rows), f"trace {trace}"
    elif workload == "suite" or workload.startswith("suite:"):
        requests, source = load_suite(parse_categories(workload.partition(":")[2]), per_category), workload
    else:
        requests, source = read_workload(workload, bad_rows=bad_rows), workload
    if trace:
        requests.sort(key=lambda r: r.arrival_time)
    info = {"source": source, "requests": len(requests), "categories": sorted({r.category for r in requests}),
            "skipped_rows": bad_rows.count, "empty_rows": bad_rows.empty}
    return requests, info


def load_points(concurrency: str | None, rate: str | None, trace: str | None = None,
                time_scale: float = 1.0) -> list[LoadPoint]:
    """Trace replay first (when a trace is given), then the concurrency sweep, then the rates."""
    loads = [LoadPoint("trace", time_scale)] if trace else []
    if concurrency:
        loads += [LoadPoint("concurrency", c) for c in parse_values(concurrency, "--concurrency", True)]
    if rate:
        loads += [LoadPoint("rate", r) for r in parse_values(rate, "--rate")]
    return loads


def point_requests(point: LoadPoint, workload: list[WorkloadRequest], num_requests: int | None) -> list[WorkloadRequest]:
    """The requests of one load point: the same for every arm (and for the simulator)."""
    if point.kind == "trace":
        return workload[:num_requests] if num_requests else list(workload)
    count = num_requests or (max(4 * int(point.value), MIN_REQUESTS) if point.kind == "concurrency"
                             else MIN_REQUESTS)
    return take(workload, count)


def _prompt_jsonl(path: str) -> bool:
    """A user workload (prompts with timestamps) given to --trace, rather than a Mooncake trace."""
    try:
        with open(path, encoding="utf-8") as file:
            first = json.loads(next((line for line in file if line.strip()), "{}"))
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and ("prompt" in first or "messages" in first)
