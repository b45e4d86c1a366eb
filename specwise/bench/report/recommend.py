"""Where speculation pays: per arm, the load range, the crossover, per-category notes.

An arm *pays* at a load point when, against the baseline at the same point,
    baseline latency / arm latency >= 1 + margin          (latency metric, e.g. mean TPOT)
    arm output throughput / baseline output throughput >= throughput floor (0.97)
The crossover is where the latency speedup falls through 1.0 (break-even), interpolated
on a log scale of the load between the two measured points around it. Worked example:
speedups 1.4 at concurrency 4 and 0.8 at 16 cross 1.0 at 4 * (16/4) ** (0.4/0.6) = 10.1.
"""

import math
from dataclasses import dataclass, field

from specwise.bench.load.arrivals import LoadPoint
from specwise.bench.report.server_configs import batch_size_table, sglang_flags, vllm_config
from specwise.bench.report.summary import Summary

DEFAULT_METRIC = "tpot_mean"
DEFAULT_MARGIN = 0.05
DEFAULT_THROUGHPUT_FLOOR = 0.97


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
    loads, speedup, ratio, missing = [], {}, {}, []
    for value in summary.load_values(kind):
        row = summary.row(arm["name"], kind, value)
        if row is None or row.speedup.get(metric) is None:
            missing.append(value)
            continue
        loads.append(value)
        speedup[value] = row.speedup.get(metric)
        ratio[value] = row.speedup.get("output_throughput")
    pays = [_pays(speedup[v], ratio[v], margin, floor) for v in loads]
    verdict = ArmVerdict(arm=arm["name"], method=arm.get("method", "?"), load_kind=kind, speedup=speedup,
                         throughput_ratio=ratio, pays_at=[v for v, ok in zip(loads, pays) if ok],
                         ranges=contiguous_ranges(loads, pays),
                         crossover=crossover(loads, [speedup[v] for v in loads]), not_compared=missing)
    verdict.category_notes = _category_notes(summary, arm["name"], kind, loads, metric, margin, floor)
    verdict.verdict = _sentence(verdict, loads, metric, margin)
    return verdict


def _pays(speedup: float | None, ratio: float | None, margin: float, floor: float) -> bool:
    return speedup is not None and ratio is not None and speedup >= 1 + margin and ratio >= floor


def _category_notes(summary, arm, kind, loads, metric, margin, floor) -> list[str]:
    """At the lowest measured load (where speculation has the most room): which categories pay.

    e.g. "At concurrency 1, ngram-k4 pays on code_editing (1.84x, acceptance 71%); not on chat (0.97x)."
    """
    if not loads:
        return []
    load, paying, not_paying = loads[0], [], []
    for category in summary.categories():
        row = summary.row(arm, kind, load, category)
        if row is None or row.speedup.get(metric) is None:
            continue
        accepted = row.metrics.acceptance.rate if row.metrics.acceptance else None
        entry = f"{category} ({row.speedup[metric]:.2f}x" + (
            f", acceptance {accepted:.0%})" if accepted is not None else ")")
        # latency only: a category's requests share the point with the others, so its own
        # "throughput" depends on how many of them happened to finish in the window
        (paying if row.speedup[metric] >= 1 + margin else not_paying).append(entry)
    if not paying and not not_paying:
        return []
    if paying and not_paying:
        text = f"pays on {', '.join(paying)}; not on {', '.join(not_paying)}"
    else:
        text = f"pays on {', '.join(paying)}" if paying else f"does not pay on {', '.join(not_paying)}"
    return [f"At {_load_text(kind, load)}, {arm} {text}."]


def _sentence(verdict: ArmVerdict, loads: list[float], metric: str, margin: float) -> str:
    kind = verdict.load_kind
    if not verdict.ranges:
        return (f"{verdict.arm} does not pay at any measured {kind} "
                f"(needs {1 + margin:.2f}x {metric} with throughput kept)." + _not_compared(verdict))
    spans = ", ".join(_span_text(kind, lo, hi) for lo, hi in verdict.ranges)
    text = f"{verdict.arm} pays at {spans}"
    if verdict.crossover is not None:
        text += f"; break-even near {_load_text(kind, verdict.crossover)}"
    elif verdict.ranges[-1][1] == loads[-1]:
        text += f"; still ahead at the highest compared load ({_load_text(kind, loads[-1])})"
    return text + "." + _not_compared(verdict)


def _not_compared(verdict: ArmVerdict) -> str:
    if not verdict.not_compared:
        return ""
    loads = ", ".join(f"{value:g}" for value in verdict.not_compared)
    return f" Not compared at {verdict.load_kind} {loads}: no request finished there in this arm or the baseline."


def _best_arms(summary: Summary, kind: str, verdicts: list[ArmVerdict]) -> dict[float, str]:
    """At each load, the paying arm with the largest speedup; the baseline where none pays."""
    best = {}
    for value in summary.load_values(kind):
        paying = [(v.speedup[value], v.arm) for v in verdicts if value in v.pays_at]
        best[value] = max(paying)[1] if paying else summary.baseline
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
        table = batch_size_table(pairs, _max_batch(summary)) if kind == "concurrency" else []
        k = max(pairs, key=lambda pair: _first_speedup(pair[1]))[0]
        configs.append({"spec": spec, "method": method, "k": k, "pays": any(v.ranges for _, v in pairs),
                        "batch_size_table": table, **vllm_config(spec, method, k, table),
                        **sglang_flags(spec, method, k)})
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
