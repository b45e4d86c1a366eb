"""Where speculation pays: per arm, the load range, the crossover, per-category notes.

Each load point gets one of three verdicts, from the paired intervals (bench/stats/) of
the latency speedup s = baseline latency / arm latency (e.g. mean TPOT) and of the
throughput ratio t = arm output throughput / baseline output throughput:
    pays        low(s) >= 1 + margin and low(t) >= throughput floor (0.97)
    loses       high(s) < 1 (break-even) or high(t) < throughput floor
    can't tell  anything else, "at this sample size": with an estimate of how many more
                paired requests would decide it (below)
A point estimate alone never decides: a row without an interval is "can't tell", unless
the summary has no records at all (a model's prediction, exact by construction).
More requests: an interval's half-width shrinks as 1/sqrt(n), so with n pairs, the
estimate s >= 1 + margin and a lower half-width h = s - low(s), the lower bound clears
1 + margin after about n * (h / (s - 1 - margin))**2 pairs. Worked example: n = 10,
s = 1.30, low = 1.02: (0.28 / 0.25)**2 * 10 = 12.5, i.e. about 3 more requests per arm.
Likewise for the throughput ratio against its floor, and for the upper bounds where an
estimate lies below break-even (or the floor) and more requests would show a loss.
Where no count can be estimated the report says why, in a few words (`MoreRequests`):
fewer than MIN_PAIRS requests measure the metric, so it has no interval to shrink; the
estimate lies between break-even and the margin, where no sample size need decide; the
throughput ratio has no interval, or sits exactly on its floor.
The crossover is where the latency speedup falls through 1.0 (break-even), interpolated
on a log scale of the load between the two measured points around it. Worked example:
speedups 1.4 at concurrency 4 and 0.8 at 16 cross 1.0 at 4 * (16/4) ** (0.4/0.6) = 10.1.
"""

import math
from dataclasses import dataclass, field

from specwise.bench.load.arrivals import LoadPoint
from specwise.bench.report.server_configs import batch_size_table, sglang_flags, trtllm_config, vllm_config
from specwise.bench.report.summary import Summary
from specwise.bench.stats.paired import MIN_PAIRS

DEFAULT_METRIC = "tpot_mean"
DEFAULT_MARGIN = 0.05
DEFAULT_THROUGHPUT_FLOOR = 0.97
PAYS, LOSES, UNSURE = "pays", "loses", "can't tell"


@dataclass(frozen=True)
class MoreRequests:
    """More paired requests per arm that would decide a "can't tell" point, or why no count can be given."""
    count: int | None = None
    reason: str = ""            # where count is None, e.g. "its estimate lies between break-even and ..."

    def text(self) -> str:
        """The wording of it, in the verdict sentence and the table alike."""
        return self.reason if self.count is None else counts_text([self.count])


def counts_text(counts: list[int]) -> str:
    return f"about {', '.join(str(count) for count in counts)} more requests per arm would decide"


@dataclass
class ArmVerdict:
    arm: str
    method: str
    load_kind: str
    speedup: dict[float, float | None]          # load value -> latency speedup
    throughput_ratio: dict[float, float | None]
    pays_at: list[float]
    ranges: list[tuple[float, float]]           # contiguous measured loads where it pays
    crossover: float | None
    not_compared: list[float] = field(default_factory=list)   # loads lacking figures for this arm or the baseline
    category_notes: list[str] = field(default_factory=list)
    verdict: str = ""
    calls: dict[float, str] = field(default_factory=dict)      # load -> "pays" | "loses" | "can't tell"
    intervals: dict[float, list[float] | None] = field(default_factory=dict)     # of the latency speedup
    throughput_intervals: dict[float, list[float] | None] = field(default_factory=dict)
    paired: dict[float, int | None] = field(default_factory=dict)   # requests both arms completed
    more_requests: dict[float, MoreRequests] = field(default_factory=dict)  # measured "can't tell" loads


@dataclass
class Recommendation:
    metric: str
    margin: float
    throughput_floor: float
    baseline: str | None
    verdicts: list[ArmVerdict]
    best_arm: dict[str, dict[float, str]]        # load kind -> load value -> best arm (or baseline)
    configs: list[dict]                          # per method: vLLM JSON, batch-size table, SGLang flags


def recommend(summary: Summary, metric: str = DEFAULT_METRIC, margin: float = DEFAULT_MARGIN,
              throughput_floor: float = DEFAULT_THROUGHPUT_FLOOR) -> Recommendation:
    verdicts = [_verdict(summary, arm, kind, metric, margin, throughput_floor)
                for kind in summary.load_kinds() for arm in summary.arms if arm["name"] != summary.baseline]
    verdicts = [v for v in verdicts if v.speedup or v.not_compared]
    best = {kind: _best_arms(summary, kind, [v for v in verdicts if v.load_kind == kind])
            for kind in summary.load_kinds()}
    return Recommendation(metric=metric, margin=margin, throughput_floor=throughput_floor,
                          baseline=summary.baseline, verdicts=verdicts, best_arm=best,
                          configs=_configs(summary, verdicts))


def crossover(loads: list[float], speedups: list[float | None]) -> float | None:
    """First load where the speedup falls from >= 1 to < 1, log-interpolated."""
    points = [(x, s) for x, s in zip(loads, speedups) if s is not None]
    for (x0, s0), (x1, s1) in zip(points, points[1:]):
        if s0 >= 1.0 > s1:
            fraction = (s0 - 1.0) / (s0 - s1)
            return math.exp(math.log(x0) + fraction * (math.log(x1) - math.log(x0)))
    return None


def contiguous_ranges(loads: list[float], pays: list[bool]) -> list[tuple[float, float]]:
    """Runs of consecutive measured loads that pay: ([1,2,4,8], [T,T,F,T]) -> [(1,2), (8,8)]."""
    ranges, start = [], None
    for index, (load, ok) in enumerate(zip(loads, pays)):
        if ok and start is None:
            start = load
        if start is not None and (not ok or index == len(loads) - 1):
            ranges.append((start, load if ok else loads[index - 1]))
            start = None
    return ranges


def _verdict(summary: Summary, arm: dict, kind: str, metric: str, margin: float, floor: float) -> ArmVerdict:
    loads, missing = [], []
    verdict = ArmVerdict(arm=arm["name"], method=arm.get("method", "?"), load_kind=kind, speedup={},
                         throughput_ratio={}, pays_at=[], ranges=[], crossover=None)
    exact = not any(row.paired is not None for row in summary.rows)     # no records: nothing was sampled
    for value in summary.load_values(kind):
        row = summary.row(arm["name"], kind, value)
        if row is None or row.speedup.get(metric) is None:
            missing.append(value)
            continue
        loads.append(value)
        s, t = row.speedup.get(metric), row.speedup.get("output_throughput")
        verdict.speedup[value], verdict.throughput_ratio[value], verdict.paired[value] = s, t, row.paired
        s_range = _range(s, row.intervals.get(metric), exact)
        t_range = _range(t, row.intervals.get("output_throughput"), exact)
        verdict.intervals[value], verdict.throughput_intervals[value] = s_range, t_range
        verdict.calls[value] = call(s_range, t_range, margin, floor)
        if verdict.calls[value] == UNSURE and not exact:
            verdict.more_requests[value] = more_requests(row.paired, metric, s, s_range, t, t_range, margin, floor)
    pays = [verdict.calls[v] == PAYS for v in loads]
    verdict.pays_at, verdict.ranges, verdict.not_compared = [v for v, ok in zip(loads, pays) if ok], \
        contiguous_ranges(loads, pays), missing
    verdict.crossover = crossover(loads, [verdict.speedup[v] for v in loads])
    verdict.category_notes = _category_notes(summary, arm["name"], kind, loads, metric, margin, floor)
    verdict.verdict = _sentence(verdict, loads, metric, margin)
    return verdict


def _range(value: float | None, interval: list[float] | None, exact: bool) -> list[float] | None:
    if interval is not None:
        return list(interval)
    return [value, value] if exact and value is not None else None


def call(s_range: list[float] | None, t_range: list[float] | None, margin: float, floor: float) -> str:
    """PAYS, LOSES or UNSURE from the intervals of the latency speedup and the throughput ratio."""
    if (s_range is not None and s_range[1] < 1.0) or (t_range is not None and t_range[1] < floor):
        return LOSES
    if s_range is not None and t_range is not None and s_range[0] >= 1 + margin and t_range[0] >= floor:
        return PAYS
    return UNSURE


def more_requests(n: int, metric: str, s: float, s_range: list[float] | None, t: float | None,
                  t_range: list[float] | None, margin: float, floor: float) -> MoreRequests:
    """Roughly how many more paired requests would decide a measured UNSURE point (see the module doc).

    n pairs gave the latency speedup s (of `metric`) and the throughput ratio t, with their intervals.
    The point loses once high(s) < 1 or high(t) < floor, and pays once low(s) >= 1 + margin and
    low(t) >= floor: the count is that of the nearest of these the estimates point to.
    """
    if n < MIN_PAIRS:
        return MoreRequests(MIN_PAIRS - n)                  # no interval yet: at least this many more
    t_known = t is not None and t_range is not None
    needed = []
    if s_range is not None and s < 1:
        needed.append(_pairs_needed(n, s_range[1] - s, 1 - s))
    if t_known and t < floor:
        needed.append(_pairs_needed(n, t_range[1] - t, floor - t))
    if s_range is not None and s > 1 + margin and t_known and t > floor:     # both lower bounds must clear
        needed.append(max(_pairs_needed(n, s - s_range[0], s - 1 - margin),
                          _pairs_needed(n, t - t_range[0], t - floor)))
    if needed:
        return MoreRequests(max(min(needed) - n, 1))
    if s_range is None:
        return MoreRequests(reason=f"too few of its requests measure {metric} to give an interval")
    if s <= 1 + margin:
        return MoreRequests(reason=f"its estimate lies between break-even and the {margin:.0%} margin, "
                                   "so more requests may not decide it")
    if not t_known:
        return MoreRequests(reason="output throughput has no interval")
    return MoreRequests(reason=f"its throughput ratio sits exactly on the {floor:.0%} floor")


def _pairs_needed(n: int, half_width: float, distance: float) -> int:
    """Pairs after which a bound now half_width from the estimate lies distance from it (distance > 0)."""
    return math.ceil(n * (half_width / distance) ** 2)


def _category_notes(summary, arm, kind, loads, metric, margin, floor) -> list[str]:
    """At the lowest measured load (where speculation has the most room): which categories pay.

    e.g. "At concurrency 1, ngram-k4 pays on code_editing (1.84x [1.52, 2.20], acceptance 71%);
    not on chat (0.97x [0.90, 1.05], can't tell)." A category pays when its interval's lower
    bound clears the margin; one with too few pairs for an interval cannot pay.
    """
    if not loads:
        return []
    load, paying, not_paying = loads[0], [], []
    exact = not any(row.paired is not None for row in summary.rows)
    for category in summary.categories():
        row = summary.row(arm, kind, load, category)
        if row is None or row.speedup.get(metric) is None:
            continue
        accepted = row.metrics.acceptance.rate if row.metrics.acceptance else None
        interval = row.intervals.get(metric)
        # latency only: a category's requests share the point with the others, so its own
        # "throughput" depends on how many of them happened to finish in the window
        outcome = call(_range(row.speedup[metric], interval, exact), [1.0, 1.0], margin, 1.0)
        entry = f"{category} ({row.speedup[metric]:.2f}x" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]"
                                                             if interval and interval[0] < interval[1] else "")
        entry += f", acceptance {accepted:.0%}" if accepted is not None else ""
        if not exact and outcome == UNSURE and not interval:
            entry += ", can't tell (too few requests)"
        elif not exact and outcome != PAYS and interval and interval[0] < interval[1]:
            entry += f", {outcome}"
        (paying if outcome == PAYS else not_paying).append(entry + ")")
    if not paying and not not_paying:
        return []
    if paying and not_paying:
        text = f"pays on {', '.join(paying)}; not on {', '.join(not_paying)}"
    else:
        text = f"pays on {', '.join(paying)}" if paying else f"does not pay on {', '.join(not_paying)}"
    return [f"At {_load_text(kind, load)}, {arm} {text}."]


def _sentence(verdict: ArmVerdict, loads: list[float], metric: str, margin: float) -> str:
    kind = verdict.load_kind
    unsure = [load for load in loads if verdict.calls.get(load) == UNSURE and not _short(verdict, load, margin)]
    within = [load for load in loads if verdict.calls.get(load) == UNSURE and _short(verdict, load, margin)]
    extra = _unsure(verdict, unsure) + _within(kind, within, margin) + _not_compared(verdict)
    if not verdict.ranges:
        shown = "is not shown to pay" if unsure else "does not pay"
        return (f"{verdict.arm} {shown} at any measured {kind} "
                f"(needs {1 + margin:.2f}x {metric} with throughput kept)." + extra)
    spans = ", ".join(_span_text(kind, lo, hi) for lo, hi in verdict.ranges)
    text = f"{verdict.arm} pays at {spans}"
    if verdict.crossover is not None:
        text += f"; break-even near {_load_text(kind, verdict.crossover)}"
    loses = [load for load in loads if verdict.calls.get(load) == LOSES]
    if loses and verdict.crossover is None:
        text += f"; loses at {kind} {', '.join(f'{value:g}' for value in loses)}"
    elif verdict.ranges[-1][1] == loads[-1]:
        text += f"; still ahead at the highest compared load ({_load_text(kind, loads[-1])})"
    return text + "." + extra


def _short(verdict: ArmVerdict, load: float, margin: float) -> bool:
    """Sure not to pay, though not below break-even: the whole interval is under 1 + margin."""
    interval = verdict.intervals.get(load)
    return interval is not None and interval[1] < 1 + margin


def _within(kind: str, loads: list[float], margin: float) -> str:
    if not loads:
        return ""
    values = ", ".join(f"{value:g}" for value in loads)
    return (f" At {kind} {values} it cannot clear the {margin:.0%} margin (its interval lies below "
            f"{1 + margin:.2f}x but reaches break-even): not worth it there, though not shown to lose.")


def _unsure(verdict: ArmVerdict, unsure: list[float]) -> str:
    """" Can't tell at concurrency 4, 8 at this sample size (about 12, 40 more requests per arm would decide)."

    Loads sharing a reason for no count are listed together, after the counted ones:
    " Can't tell at concurrency 1, 4, 8 at this sample size: about 12 more requests per arm would
    decide concurrency 4; at 1, 8 its estimate lies between break-even and the 5% margin, so ..."
    """
    if not unsure:
        return ""
    kind, more = verdict.load_kind, verdict.more_requests
    counted = [load for load in unsure if more[load].count is not None]
    groups: dict[str, list[float]] = {}
    for load in unsure:
        if more[load].count is None:
            groups.setdefault(more[load].text(), []).append(load)
    parts = []
    if counted:
        parts.append(counts_text([more[load].count for load in counted]))
    parts += list(groups)
    if len(parts) == 1:
        return f" Can't tell at {kind} {_values(unsure)} at this sample size ({parts[0]})."
    pieces = ([f"{parts[0]} {kind} {_values(counted)}"] if counted else []) + \
        [f"at {_values(loads)} {reason}" for reason, loads in groups.items()]
    return f" Can't tell at {kind} {_values(unsure)} at this sample size: {'; '.join(pieces)}."


def _values(loads: list[float]) -> str:
    return ", ".join(f"{value:g}" for value in loads)


def _not_compared(verdict: ArmVerdict) -> str:
    if not verdict.not_compared:
        return ""
    loads = ", ".join(f"{value:g}" for value in verdict.not_compared)
    return f" Not compared at {verdict.load_kind} {loads}: no request finished there in this arm or the baseline."


def _best_arms(summary: Summary, kind: str, verdicts: list[ArmVerdict]) -> dict[float, str]:
    """At each load, the paying arm with the highest lower bound; the baseline where none pays."""
    best = {}
    for value in summary.load_values(kind):
        paying = [(v.intervals[value][0], v.speedup[value], v.arm) for v in verdicts if value in v.pays_at]
        best[value] = max(paying)[2] if paying else summary.baseline
    return best


def _configs(summary: Summary, verdicts: list[ArmVerdict]) -> list[dict]:
    """One entry per drafter (arms of the same drafter at several k share one table).

    Endpoint arms without a known drafter and k are left out: their server already
    has its configuration; the verdict says where to use it.
    """
    arms = {arm["name"]: arm for arm in summary.arms}
    kinds = {v.load_kind for v in verdicts}
    kind = "concurrency" if "concurrency" in kinds else next(iter(sorted(kinds)), None)
    groups: dict[str, list[tuple[int, ArmVerdict]]] = {}
    for verdict in verdicts:
        arm = arms.get(verdict.arm, {})
        if verdict.load_kind == kind and arm.get("spec") and arm.get("k"):
            groups.setdefault(arm["spec"], []).append((arm["k"], verdict))
    configs = []
    for spec, pairs in groups.items():
        method = pairs[0][1].method
        # an arm an engine ran (evaluate --engine) names a checkpoint in the server's format
        arm = arms.get(pairs[0][1].arm, {})
        checkpoint = "server" if arm.get("engine") else "specwise"
        # our head exported for vLLM (bench/launch/exports.py): vLLM's format, which SGLang does not read
        sglang_checkpoint = "specwise" if arm.get("exported_from") else checkpoint
        table = batch_size_table(pairs, _max_batch(summary)) if kind == "concurrency" else []
        k = max(pairs, key=lambda pair: _first_speedup(pair[1]))[0]
        configs.append({"spec": spec, "method": method, "k": k, "pays": any(v.ranges for _, v in pairs),
                        "batch_size_table": table, **vllm_config(spec, method, k, table, checkpoint),
                        **sglang_flags(spec, method, k, sglang_checkpoint), **trtllm_config(spec, method)})
    return configs


def _first_speedup(verdict: ArmVerdict) -> float:
    """Speedup at the lowest measured load: where the drafter has the most room."""
    values = [verdict.speedup[load] for load in sorted(verdict.speedup)]
    return next((value for value in values if value is not None), 0.0)


def _max_batch(summary: Summary) -> int:
    engine = summary.run.get("engine") or {}
    return int(engine.get("max_num_seqs") or 256)


def _load_text(kind: str, value: float) -> str:
    return LoadPoint(kind, round(value, 2)).label()


def _span_text(kind: str, lo: float, hi: float) -> str:
    if lo == hi:
        return _load_text(kind, lo)
    if kind == "concurrency":
        return f"concurrency {lo:g}-{hi:g}"
    return f"{lo:g}-{hi:g} req/s" if kind == "rate" else f"trace x{lo:g}-x{hi:g}"
