"""`specwise simulate --validate RESULTS_DIR`: a measured `evaluate` run, replayed on paper.

The same requests (each with its measured prompt and output length and its own measured drafts,
replayed as counted: sim/request_acceptance.py `Replay`; a session's turn sent after the turn before
it has finished, as evaluate sends them), at the same load points, in the same rounds, for the same
arms, through the flat simulator (sim/flat.py) with the engine's batch limits and KV cache from
run.json and the given step-cost model (`--profile`). A closed-loop round is replayed as a closed loop of the
same concurrency over the round's requests in the order evaluate's workers took them (the run's
workload read again in its planned order; the send order where it cannot be read: a held session
turn is taken before the requests sent ahead of it); a rate or trace round sends each request at
its measured send time. The simulated records are placed at the measured
round's start, so both sides go through the same metric code (bench/report/summary.py) and the
same verdicts (bench/report/recommend.py).

Printed per load point and arm: measured against predicted mean TTFT, mean TPOT, the median step
(the median gap between a request's consecutive streamed chunks, pooled over the point's requests:
a decode step, where each chunk is one, so that an error there is the step cost's and an error in
TPOT beside a right step is the schedule's), output throughput, acceptance rate, and the verdict;
the error is predicted / measured - 1. Then per
metric the median and the worst absolute error over the points, how many requests' own TTFT and TPOT
are predicted within 10% (a point's mean can be right by cancellation: one request predicted early,
another late), and how many verdicts agree where the measurement decided one (not "can't tell").

Replayed arms: off and the model-free drafters (ngram, suffix, lookahead), whose drafting costs
no forward the profile does not hold. Others are listed as not replayed. An endpoint arm's method
comes from its name (`--endpoint ngram=URL`) and its k, which run.json does not know, from its
requests' per-position acceptance counters.
"""

import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specwise.bench.inputs.request import WorkloadRequest
from specwise.bench.load.arrivals import LoadPoint
from specwise.bench.load.metrics import REQUEST_LATENCY
from specwise.bench.load.order import seeded_order
from specwise.bench.load.plan import load_workload
from specwise.bench.load.sessions import session_key
from specwise.bench.report.recommend import UNSURE, ArmVerdict, Recommendation, recommend
from specwise.bench.report.summary import ALL, summarize
from specwise.bench.results import RequestRecord, read_records, read_run_info
from specwise.calc.arms import MODEL_FREE, OFF, SpecArm, build_arm
from specwise.calc.deployment import Deployment
from specwise.engine.cost.step_cost import StepCostModel
from specwise.engine.spec_decode.config import SpeculativeConfig
from specwise.errors import InputError, SpecwiseError
from specwise.sim.flat import FlatSimulator
from specwise.sim.records import write_results
from specwise.sim.request_acceptance import from_record
from specwise.sim.simulator import SimServerConfig

METRICS = (("TTFT", "ttft"), ("TPOT", "tpot"), ("step", "step"), ("tok/s", "throughput"), ("accept", "acceptance"))
REPLAYABLE = ("off", *MODEL_FREE, "lookahead")
PER_REQUEST = (("TTFT", "ttft"), ("TPOT", "tpot"))      # the latencies compared request by request
WITHIN = 0.10               # a request's prediction within this relative error counts as right


@dataclass(frozen=True)
class Speedup:
    """What a verdict stands on (bench/report/recommend.py): the paired latency speedup over the baseline and
    the throughput ratio, each with its interval (None: too few pairs), and the bounds "pays" needs their
    lower ends to clear."""
    speedup: float | None
    interval: list[float] | None
    throughput: float | None
    throughput_interval: list[float] | None
    margin: float
    floor: float
    metric: str                 # the latency the speedup is of (recommend.py's metric, e.g. tpot_mean)

    def text(self) -> str:
        """e.g. "1.30x [1.10, 1.68], tok/s 1.25x [1.10, 1.47]"."""
        def one(value, interval):
            if value is None:
                return "-"
            return f"{value:.2f}x" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else " (no interval)")
        return f"{one(self.speedup, self.interval)}, tok/s {one(self.throughput, self.throughput_interval)}"


@dataclass
class PointComparison:
    arm: str
    load_kind: str
    load_value: float
    measured: dict[str, float | None]
    predicted: dict[str, float | None]
    verdicts: tuple[str | None, str | None] = (None, None)      # measured, predicted (None for the baseline)
    speedups: tuple[Speedup | None, Speedup | None] = (None, None)      # what each verdict stands on

    def error(self, key: str) -> float | None:
        real, model = self.measured.get(key), self.predicted.get(key)
        return None if not real or model is None else model / real - 1


@dataclass
class Validation:
    points: list[PointComparison]
    skipped: dict[str, str] = field(default_factory=dict)       # arm -> why it was not replayed
    predicted_records: list[RequestRecord] = field(default_factory=list)
    assumed: str = ""           # the server limits the run did not say, as the replay took them (server_from_run)
    requests: dict[str, list[float]] = field(default_factory=dict)     # key -> each request's error (request_errors)

    def error_summary(self, key: str, load_kind: str | None = None) -> tuple[float, float, int] | None:
        """(median, worst, count) of the absolute errors over the points (of one load kind); None: no point."""
        errors = [abs(e) for p in self.points if load_kind in (None, p.load_kind) if (e := p.error(key)) is not None]
        return (statistics.median(errors), max(errors), len(errors)) if errors else None

    def request_summary(self, key: str) -> tuple[int, int, float] | None:
        """(how many within WITHIN, count, median absolute error) of the requests' own errors; None: no request."""
        errors = self.requests.get(key)
        if not errors:
            return None
        return sum(abs(e) <= WITHIN for e in errors), len(errors), statistics.median(map(abs, errors))

    def verdict_counts(self) -> tuple[int, int, int]:
        """(agree, decided, can't tell): the points where the measurement decided a verdict, how many of them the
        prediction agrees with, and the points where the measurement can't tell."""
        decided = [p for p in self.points if p.verdicts[0] not in (None, UNSURE)]
        return (sum(1 for p in decided if p.verdicts[0] == p.verdicts[1]), len(decided),
                sum(1 for p in self.points if p.verdicts[0] == UNSURE))

    def to_json(self) -> dict:
        """validation.json (`--output`): every point's figures and errors, then the summary lines' figures."""
        points = [{"arm": p.arm, "load_kind": p.load_kind, "load_value": p.load_value, "measured": p.measured,
                   "predicted": p.predicted, "error": {key: p.error(key) for _, key in METRICS},
                   "verdict": dict(zip(("measured", "predicted"), p.verdicts)),
                   "speedup": dict(zip(("measured", "predicted"), (asdict(s) if s else None for s in p.speedups)))}
                  for p in self.points]
        summary = {key: dict(zip(("median_abs_error", "worst_abs_error", "points"), figures))
                   for _, key in METRICS if (figures := self.error_summary(key))}
        agree, decided, unsure = self.verdict_counts()
        requests = {key: {"within": WITHIN} | dict(zip(("count_within", "requests", "median_abs_error"), figures))
                    for _, key in PER_REQUEST if (figures := self.request_summary(key))}
        return {"points": points, "errors": summary, "request_errors": requests,
                "verdicts": {"agree": agree, "decided": decided, "cant_tell": unsure}, "not_replayed": self.skipped,
                "assumed": self.assumed}


def server_from_run(run: dict, flags: SimServerConfig, deployment: Deployment) -> tuple[SimServerConfig, int, int, str]:
    """The measured engine's limits and KV cache (run.json "engine", in-process runs), else what its server said
    of them (run.json "said", the baseline arm's: `specwise serve` on /health, vLLM its KV cache on /metrics),
    else the flags. Returns (server, KV capacity in tokens, max_model_len, a line naming the limits taken from
    the flags, "" where the run said them all)."""
    engine = run.get("engine") or {}
    said = (run.get("said") or {}).get(run.get("baseline")) or {}
    assumed = []

    def limit(name: str) -> int:
        value = engine.get(name, said.get(name))
        if value is None:
            assumed.append((name, getattr(flags, name)))
        return getattr(flags, name) if value is None else value

    server = SimServerConfig(max_num_seqs=limit("max_num_seqs"),
                             max_num_batched_tokens=limit("max_num_batched_tokens"),
                             block_size=limit("block_size"), kv_cache_tokens=flags.kv_cache_tokens)
    if flags.kv_cache_tokens:
        capacity = flags.kv_cache_tokens
    elif engine.get("num_kv_blocks"):
        capacity = engine["num_kv_blocks"] * server.block_size
    elif engine.get("kv_cache_gb"):
        capacity = int(engine["kv_cache_gb"] * 2**30 / deployment.kv_bytes_per_token)
    elif said.get("kv_cache_tokens"):
        capacity = said["kv_cache_tokens"]
    else:
        capacity = deployment.memory_plan().kv_capacity_tokens
        assumed.append(("kv_cache_tokens", capacity))
    note = ""
    if assumed:
        names = ", ".join(f"--{name.replace('_', '-')} {value}" for name, value in assumed)
        note = f"the run does not say its server's {', '.join(name for name, _ in assumed)}: replayed with {names}"
    return server, capacity, engine.get("max_model_len") or 0, note


def validate(results_dir, cost: StepCostModel, deployment: Deployment, flags: SimServerConfig,
             seed: int = 0) -> Validation:
    run = read_run_info(results_dir)
    measured = [r for r in read_records(results_dir) if not r.warmup]
    if not measured:
        raise InputError(f"{results_dir}: no measured requests to replay")
    server, capacity, max_model_len, assumed = server_from_run(run, flags, deployment)
    simulator = FlatSimulator(cost, server, capacity, seed=seed, max_model_len=max_model_len or None)
    arms, skipped = _arms(run, measured, results_dir, cost, deployment)
    groups: dict[tuple, list[RequestRecord]] = defaultdict(list)
    for record in measured:
        if record.arm in arms and not record.error:
            groups[(record.arm, record.load_kind, record.load_value, record.round)].append(record)
    workload = measured_workload(run)
    after, places = session_turns(workload), plan_positions(workload)
    predicted = []
    for (name, kind, value, round_), records in groups.items():
        predicted += _replay(simulator, arms[name], LoadPoint(kind, value), round_, records, after, places)
    kept = [r for r in measured if r.arm in arms]
    return Validation(compare(kept, predicted, run), skipped, predicted, assumed, request_errors(kept, predicted))


def _arms(run: dict, measured, results_dir, cost, deployment) -> tuple[dict[str, SpecArm], dict[str, str]]:
    specs = {arm["name"]: arm for arm in run.get("arms", []) if isinstance(arm, dict) and "name" in arm}
    for record in measured:
        specs.setdefault(record.arm, {"name": record.arm, "method": record.method, "k": None})
    arms, skipped = {}, {}
    for name, spec in specs.items():
        method, k = spec.get("method", "?"), spec.get("k") or _k_from_records(measured, name)
        if method == "off":
            arms[name] = OFF
        elif method not in REPLAYABLE:
            skipped[name] = f"drafting by {method} costs forwards the profile does not hold"
        elif not k:
            skipped[name] = "its k is not in run.json"
        else:
            keys = {"k": str(k), "from": str(results_dir), "arm": name, "name": name}
            if method == "lookahead":
                sizes = SpeculativeConfig.parse(spec.get("spec") or "lookahead", k)
                keys |= {"w": str(sizes.lookahead_window), "n": str(sizes.lookahead_ngram),
                         "g": str(sizes.lookahead_candidates)}
            arms[name] = build_arm(method, keys, cost, deployment)
    return arms, skipped


def _k_from_records(measured: list[RequestRecord], arm: str) -> int | None:
    """An endpoint arm's k, where run.json lacks it: the length of its requests' per-position counters
    (vLLM's acceptance histogram has k + 1 entries, our server's per-position list k)."""
    lengths = [len(r.accepted_per_position) for r in measured if r.arm == arm and r.accepted_per_position]
    return max(lengths) if lengths else None


def measured_workload(run: dict) -> list[WorkloadRequest]:
    """The measured run's workload read again (run.json "config"), in the order evaluate sent it
    (bench/load/plan.py: seeded unless --order file); [] where it cannot be read (a file gone) or
    is a trace."""
    config = run.get("config") or {}
    if config.get("trace"):
        return []
    try:
        requests, _ = load_workload(config.get("workload") or "suite", per_category=config.get("per_category"),
                                    skip_bad_rows=bool(config.get("skip_bad_rows")))
    except (SpecwiseError, OSError):
        return []
    return seeded_order(requests, config.get("seed", 0)) if config.get("order", "seeded") == "seeded" else requests


def session_turns(workload: list[WorkloadRequest]) -> dict[str, str]:
    """request id -> the id of the session turn before it; {} for a workload of no sessions (or none read)."""
    turns = {(r.extra.get("session"), r.extra.get("turn")): r.request_id for r in workload
             if session_key(r) is not None}
    return {rid: turns[(session, turn - 1)] for (session, turn), rid in turns.items() if (session, turn - 1) in turns}


def plan_positions(workload: list[WorkloadRequest]) -> dict[str, int]:
    """base request id -> its place in the order evaluate's closed-loop workers took requests (a repeat
    "id#n" is n x len(workload) places later: bench/load/arrivals.take); {} where two requests share an
    id. A turn held for the turn before it is taken at its place but sent later, so the send order alone
    misplaces it: worked example, concurrency 2 over [a-t0, a-t1, b]: a-t1 is taken second and sent when
    a-t0 ends; b is taken third, sent when the first worker frees, before a-t1."""
    places = {r.request_id: index for index, r in enumerate(workload)}
    return places if len(places) == len(workload) else {}


def _replay(simulator: FlatSimulator, arm: SpecArm, load: LoadPoint, round_, records: list[RequestRecord],
            after: dict[str, str], places: dict[str, int]):
    """One round of one arm at one point, replayed: predicted records at the measured round's times.
    A closed loop's workers take the requests in the plan's order where it is known, else in send order."""
    start = min(r.send_time for r in records)
    records = sorted(records, key=lambda r: r.send_time)
    order = [_place(r.request_id, places) for r in records]
    if load.kind == "concurrency" and None not in order:
        records = [r for _, r in sorted(zip(order, records), key=lambda pair: pair[0])]
    requests = [WorkloadRequest(request_id=r.request_id, category=r.category, max_tokens=max(1, r.output_tokens),
                                prompt_tokens=max(1, r.prompt_tokens)) for r in records]
    k = arm.policy.max_k if arm.speculative else 0
    own = {r.request_id: d for r in records if (d := from_record(r, k, replay=True)) is not None} if k else None
    arrivals = None if load.kind == "concurrency" else [r.send_time - start for r in records]
    follows = {}                                   # repeats ("id#2") follow their own session's turns
    for r in records:
        base, mark, repeat = r.request_id.partition("#")
        if base in after:
            follows[r.request_id] = after[base] + mark + repeat
    result = simulator.run(requests, arm, load, own=own, arrivals=arrivals, after=follows)
    for record in result.records:
        record.send_time += start
        record.round = round_
    return result.records


def _place(request_id: str, places: dict[str, int]) -> int | None:
    base, _, repeat = request_id.partition("#")
    if base not in places or (repeat and not repeat.isdigit()):
        return None
    return (int(repeat) if repeat else 0) * len(places) + places[base]


def _figures(summary, arm: str, kind: str, value: float) -> dict[str, float | None]:
    row = summary.row(arm, kind, value, ALL)
    if row is None:
        return {}
    m = row.metrics
    return {"ttft": m.ttft.mean, "tpot": m.tpot.mean, "throughput": m.output_throughput,
            "acceptance": m.acceptance.rate if m.acceptance else None}


def compare(measured: list[RequestRecord], predicted: list[RequestRecord], run: dict) -> list[PointComparison]:
    """Per load point and arm of `measured`, its figures and verdict beside those of `predicted`, each
    summarized by the report's own code under run's criteria. Any two record sets of one run's points
    compare so: a measurement and its replay, or two replays of it (benchmarks/validate_simulator.py)."""
    criteria = run.get("criteria") or {}
    options = {key: criteria[name] for key, name in (("metric", "pay_metric"), ("margin", "margin"),
                                                     ("throughput_floor", "throughput_floor")) if name in criteria}
    real, model = summarize(measured, run), summarize(predicted, {**run, "tool": "simulate"})
    calls = [recommend(s, **options) for s in (real, model)]
    by_arm = [{(v.arm, v.load_kind): v for v in r.verdicts} for r in calls]
    points = []
    for row in real.rows:
        if row.category != ALL:
            continue
        key = (row.arm, row.load_kind, row.load_value)
        verdicts = tuple(arms[key[:2]].calls.get(row.load_value) if key[:2] in arms else None for arms in by_arm)
        speedups = tuple(_speedup(arms.get(key[:2]), row.load_value, r) for arms, r in zip(by_arm, calls))
        points.append(PointComparison(*key, _figures(real, *key) | {"step": median_step(measured, *key)},
                                      _figures(model, *key) | {"step": median_step(predicted, *key)}, verdicts,
                                      speedups))
    return points


def request_errors(measured: list[RequestRecord], predicted: list[RequestRecord]) -> dict[str, list[float]]:
    """key -> predicted / measured - 1 of each request both sides finished (the same arm, load point, round and
    id), for TTFT and TPOT."""
    def key(record):
        return record.arm, record.load_kind, record.load_value, record.round, record.request_id
    replayed = {key(r): r for r in predicted if not r.error}
    pairs = [(r, replayed[key(r)]) for r in measured if not r.error and not r.warmup and key(r) in replayed]
    return {key: [model / real - 1 for r, p in pairs
                  if (real := REQUEST_LATENCY[key](r)) and (model := REQUEST_LATENCY[key](p)) is not None]
            for _, key in PER_REQUEST}


def _speedup(verdict: ArmVerdict | None, load: float, recommendation: Recommendation) -> Speedup | None:
    if verdict is None or load not in verdict.speedup:
        return None
    return Speedup(verdict.speedup.get(load), verdict.intervals.get(load), verdict.throughput_ratio.get(load),
                   verdict.throughput_intervals.get(load), recommendation.margin, recommendation.throughput_floor,
                   recommendation.metric)


def median_step(records: list[RequestRecord], arm: str, kind: str, value: float) -> float | None:
    """The median gap between consecutive streamed chunks over the point's finished requests."""
    gaps = [later - earlier for r in records
            if (r.arm, r.load_kind, r.load_value) == (arm, kind, value) and not r.error and not r.warmup
            for earlier, later in zip(r.chunk_times, r.chunk_times[1:])]
    return statistics.median(gaps) if gaps else None


def report(validation: Validation, labels: tuple[str, str] = ("meas", "pred"),
           decided_by: str = "the measurement") -> str:
    """The printed comparison (plain text, one line per point and arm); labels: the two sides' column
    heads; decided_by: the first side, in the verdicts' line."""
    first, second = labels
    head = f"{'arm':<22} {'load':>8}" + "".join(f" {name + ' ' + first:>12} {second:>9} {'err':>7}"
                                              for name, _ in METRICS)
    lines = [head + f"  {'verdict ' + first + ' / ' + second:>24}"]
    for p in validation.points:
        cells = "".join(f" {_num(p.measured.get(key), key):>12} {_num(p.predicted.get(key), key):>9}"
                        f" {_pct(p.error(key)):>7}" for _, key in METRICS)
        verdict = "" if p.verdicts[0] is None else f"{p.verdicts[0]} / {p.verdicts[1]}"
        lines.append(f"{p.arm:<22} {_load(p.load_kind, p.load_value):>8}{cells}  {verdict:>24}")
    for name, key in METRICS:
        if figures := validation.error_summary(key):
            median, worst, count = figures
            lines.append(f"{name}: median |error| {median:.1%}, worst {worst:.1%} over {count} points")
    within = [f"{name} within {WITHIN:.0%} for {figures[0]} of {figures[1]} (median |error| {figures[2]:.1%})"
              for name, key in PER_REQUEST if (figures := validation.request_summary(key))]
    if within:
        lines.append("per request: " + ", ".join(within))
    agree, decided, unsure = validation.verdict_counts()
    lines.append(f"verdicts: {agree} of {decided} agree where {decided_by} decided one "
                 f"({unsure} points where it can't tell)")
    lines += verdict_lines(validation.points, labels)
    for arm, why in validation.skipped.items():
        lines.append(f"not replayed: {arm} ({why})")
    if validation.assumed:
        lines.append(validation.assumed)
    return "\n".join(lines)


def verdict_lines(points: list[PointComparison], labels: tuple[str, str] = ("meas", "pred")) -> list[str]:
    """Each point the first side decided, with what both verdicts stand on: "pays" needs the speedup's
    lower end at 1 + margin or more and the throughput ratio's at the floor or more. Worked example (our
    server, 2026-12-07 12:07): mean-TPOT speedup measured 1.30x [1.11, 1.68], pays; predicted 1.21x [1.03,
    1.55], can't tell: its lower end 2 points under 1.05."""
    lines = []
    for p in points:
        if p.verdicts[0] in (None, UNSURE) or None in p.speedups:
            continue
        first, second = p.speedups
        lines.append(f"  {p.arm} {_load(p.load_kind, p.load_value)}: {labels[0]} {p.verdicts[0]} at "
                     f"{first.text()}; {labels[1]} {p.verdicts[1]} at {second.text()} ({first.metric} speedup; "
                     f"pays: lower ends >= {1 + first.margin:.2f}x and {first.floor:.2f}x)")
    return lines


def write_predicted(out_dir, validation: Validation, run: dict) -> None:
    """The predicted run in evaluate's format, for `specwise report`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_results(out_dir, [], {key: run[key] for key in ("model", "arms", "baseline", "loads", "slo", "criteria")
                                if key in run} | {"machine": "simulated (validate)"})
    with open(out_dir / "requests.jsonl", "a", encoding="utf-8") as file:
        file.writelines(record.to_json() + "\n" for record in validation.predicted_records)


def _num(value, key: str) -> str:
    if value is None:
        return "-"
    if key in ("ttft", "tpot", "step"):
        return f"{value * 1e3:.1f}ms"
    return f"{value:.3f}" if key == "acceptance" else f"{value:.1f}"


def _pct(value) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _load(kind: str, value: float) -> str:
    return {"concurrency": f"c={value:g}", "rate": f"{value:g}/s"}.get(kind, f"x{value:g}")
