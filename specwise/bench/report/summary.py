"""Records + run.json -> one Summary: metrics per arm, per load point, per category,
and each arm's ratios against the baseline (no speculation) at the same load point.

Ratios: `speedup[latency key]` = baseline / arm (> 1: the arm is faster);
`speedup[throughput key]` = arm / baseline (> 1: the arm serves more). They are paired
(bench/stats/paired.py): computed over the requests both the arm and the baseline
completed at that point, `paired` of them; the ratios the report shows also get a
bootstrap interval, `intervals[key]` = [low, high] at run.json "criteria"."confidence".
Rows built without records (constructed, or predicted by a model) have no intervals.
"""

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field

from specwise.bench.load.metrics import PointMetrics, point_metrics, server_acceptance_stats
from specwise.bench.results import RequestRecord
from specwise.bench.load.slo import SLO
from specwise.bench.stats.bootstrap import DEFAULT_LEVEL
from specwise.bench.stats.paired import MIN_PAIRS, compare, interval_keys, pair

ALL = "all"
SHOWN_KEYS = ("tpot_mean", "e2e_mean", "e2e_p50", "output_throughput")
MIN_CATEGORY_PAIRS = MIN_PAIRS  # a category gets intervals from this many paired requests
LATENCY_KEYS = ("ttft_mean", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_mean", "tpot_p50", "tpot_p90",
                "tpot_p99", "itl_mean", "itl_p50", "itl_p99", "e2e_mean", "e2e_p50", "e2e_p90", "e2e_p99")
PAY_METRICS = tuple(key for key in LATENCY_KEYS if not key.startswith("itl"))     # those with intervals
THROUGHPUT_KEYS = ("output_throughput", "request_throughput", "goodput")
ITL_NOTE = ("ITL is measured between streamed chunks; under speculation one chunk may carry "
            "several tokens, so ITL is chunk-level, not token-level.")


@dataclass
class Row:
    arm: str
    method: str
    load_kind: str
    load_value: float
    category: str
    metrics: PointMetrics
    speedup: dict[str, float | None] = field(default_factory=dict)
    paired: int | None = None                                   # requests both arms completed
    intervals: dict[str, list[float]] = field(default_factory=dict)     # key -> [low, high]


@dataclass
class Summary:
    tool: str
    run: dict
    baseline: str | None
    arms: list[dict]
    slo: dict
    rows: list[Row]
    notes: list[str]

    def row(self, arm: str, kind: str, value: float, category: str = ALL) -> Row | None:
        return self._index.get((arm, kind, value, category))

    def load_values(self, kind: str) -> list[float]:
        """Loads with figures, and those run.json planned (where nothing may have finished)."""
        planned = {load["value"] for load in self.run.get("loads", []) if load.get("kind") == kind}
        return sorted(planned | {r.load_value for r in self.rows if r.load_kind == kind})

    def load_kinds(self) -> list[str]:
        return sorted({r.load_kind for r in self.rows})

    def categories(self) -> list[str]:
        return sorted({r.category for r in self.rows if r.category != ALL})

    def __post_init__(self):
        self._index = {(r.arm, r.load_kind, r.load_value, r.category): r for r in self.rows}

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["rows"] = [dataclasses.asdict(row) for row in self.rows]
        return data


def metric_value(metrics: PointMetrics, key: str) -> float | None:
    """`"tpot_mean"` -> metrics.tpot.mean; a throughput key -> that attribute."""
    if key in THROUGHPUT_KEYS:
        return getattr(metrics, key)
    name, _, stat = key.partition("_")
    return getattr(getattr(metrics, name), stat)


def summarize(records: list[RequestRecord], run: dict) -> Summary:
    slo = SLO.from_dict(run.get("slo"))
    arms = _arms(records, run)
    groups: dict[tuple, list[RequestRecord]] = defaultdict(list)
    for record in records:
        if not record.warmup:
            groups[(record.arm, record.load_kind, record.load_value)].append(record)
    server = {(s["arm"], s["load_kind"], s["load_value"]): s for s in run.get("server_acceptance", [])}
    rows = []
    for (arm, kind, value), group in groups.items():
        overall = point_metrics(group, slo)
        if overall.acceptance is None and (arm, kind, value) in server:
            overall.acceptance = server_acceptance_stats(server[(arm, kind, value)])
        rows.append(Row(arm, group[0].method, kind, value, ALL, overall))
        for category in sorted({r.category for r in group}):
            members = [r for r in group if r.category == category]
            rows.append(Row(arm, group[0].method, kind, value, category,
                            point_metrics(members, slo, window_s=overall.window)))
    order = {arm["name"]: index for index, arm in enumerate(arms)}
    rows.sort(key=lambda r: (r.load_kind, order.get(r.arm, len(order)), r.load_value, r.category != ALL, r.category))
    baseline = _baseline(run, arms)
    summary = Summary(tool=run.get("tool", "evaluate"), run=run, baseline=baseline, arms=arms,
                      slo=slo.to_dict(), rows=rows, notes=_notes(run, records))
    add_speedups(summary)
    add_comparisons(summary, groups)
    return summary


def _arms(records: list[RequestRecord], run: dict) -> list[dict]:
    arms = [dict(arm) for arm in run.get("arms", []) if isinstance(arm, dict) and "name" in arm]
    known = {arm["name"] for arm in arms}
    for record in records:
        if record.arm not in known:
            arms.append({"name": record.arm, "method": record.method})
            known.add(record.arm)
    return arms


def _baseline(run: dict, arms: list[dict]) -> str | None:
    if run.get("baseline"):
        return run["baseline"]
    plain = [arm["name"] for arm in arms if arm.get("method") == "off"]
    return plain[0] if plain else (arms[0]["name"] if arms else None)


def add_speedups(summary: Summary) -> None:
    """Fill each row's ratios against the baseline row at the same load point and category."""
    for row in summary.rows:
        base = summary.row(summary.baseline, row.load_kind, row.load_value, row.category)
        if base is None or row.arm == summary.baseline:
            continue
        for key in LATENCY_KEYS:
            row.speedup[key] = _ratio(metric_value(base.metrics, key), metric_value(row.metrics, key))
        for key in THROUGHPUT_KEYS:
            row.speedup[key] = _ratio(metric_value(row.metrics, key), metric_value(base.metrics, key))


def shown_keys(run: dict) -> list[str]:
    """The ratios the report shows, each given an interval: the pay metric, TPOT, e2e, throughput."""
    metric = (run.get("criteria") or {}).get("pay_metric") or "tpot_mean"
    return list(dict.fromkeys([metric, *SHOWN_KEYS]))


def add_comparisons(summary: Summary, groups: dict[tuple, list[RequestRecord]]) -> None:
    """Recompute each row's ratios over the requests both it and the baseline completed,
    and add intervals (categories: with at least MIN_CATEGORY_PAIRS pairs)."""
    criteria = summary.run.get("criteria") or {}
    level = criteria.get("confidence") or DEFAULT_LEVEL
    seed = (summary.run.get("config") or {}).get("seed") or 0
    keys = [key for key in shown_keys(summary.run) if interval_keys(key)]
    blocks = (summary.run.get("schedule") or {}).get("kind") == "blocks"
    for row in summary.rows:
        base_records = groups.get((summary.baseline, row.load_kind, row.load_value))
        if row.arm == summary.baseline or base_records is None:
            continue
        mine = groups[(row.arm, row.load_kind, row.load_value)]
        if row.category != ALL:
            mine = [r for r in mine if r.category == row.category]
            base_records = [r for r in base_records if r.category == row.category]
        pairs = pair(mine, base_records)
        row.paired = len(pairs)
        if row.category == ALL and len(pairs) < min(row.metrics.completed, _completed(base_records)):
            summary.notes.append(
                f"At {row.load_kind} {row.load_value:g}, {row.arm} completed {row.metrics.completed} requests and "
                f"{summary.baseline} {_completed(base_records)}; ratios use the {len(pairs)} both completed.")
        arm_m, base_m = point_metrics([a for a, _ in pairs]), point_metrics([b for _, b in pairs])
        for key in LATENCY_KEYS:
            row.speedup[key] = _ratio(metric_value(base_m, key), metric_value(arm_m, key))
        if row.category != ALL and len(pairs) < MIN_CATEGORY_PAIRS:
            continue
        label = f"{row.arm}|{row.load_kind}|{row.load_value}|{row.category}"
        comparison = compare(pairs, keys, row.load_kind == "concurrency", level, seed, label, blocks)
        for key, interval in comparison.intervals.items():
            row.speedup[key] = interval.estimate
            row.intervals[key] = interval.to_list()


def _completed(records: list[RequestRecord]) -> int:
    return sum(1 for r in records if not r.error and not r.warmup)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _notes(run: dict, records: list[RequestRecord]) -> list[str]:
    notes = [ITL_NOTE, "Ratios are paired: each compares an arm with the baseline over the requests both "
                       "completed, matched by request id."]
    warmups = sum(1 for r in records if r.warmup)
    if warmups:
        notes.append(f"{warmups} warm-up request(s) excluded from every figure.")
    workload = run.get("workload") or {}
    if workload.get("skipped_rows"):
        notes.append(f"{workload['skipped_rows']} malformed input row(s) skipped (--skip-bad-rows).")
    if workload.get("clipped"):
        notes.append(f"{workload['clipped']} trace request(s) clipped to fit the model's context length.")
    per_request = {r.arm for r in records if r.drafts is not None}
    counted = {entry["arm"] for entry in run.get("server_acceptance", []) if entry.get("drafts") or entry.get("rate")}
    if counted - per_request:
        notes.append(f"Acceptance of {', '.join(sorted(counted - per_request))} comes from the server's Prometheus "
                     "counters, per load point; per-category acceptance is unknown for them.")
    if counted & per_request:
        entries = [entry for entry in run["server_acceptance"] if entry["arm"] in per_request and entry.get("drafts")]
        notes.append(f"Acceptance of {', '.join(sorted(counted & per_request))} is read from each response "
                     f"(per request, so per category too); {_agreement(entries)} (run.json server_acceptance).")
    launched = {server["arm"] for server in (run.get("launch") or {}).get("servers", [])}
    if (per_request & launched) - counted:
        notes.append(f"Acceptance of {', '.join(sorted((per_request & launched) - counted))} is read from each "
                     "response (per request, so per category too).")
    notes += launch_notes(run)
    cut = sum(entry["requests"] for entry in run.get("cut_off", []))
    if cut:
        notes.append(f"{cut} request(s) still running at twice --duration were cut off; figures leave them out.")
    if run.get("interrupted"):
        notes.append("The run was interrupted: figures cover the requests that finished.")
    return notes


def _agreement(entries: list[dict]) -> str:
    """How the responses' own counters compare with the server's Prometheus counters, point by point."""
    agree = [entry.get("requests_agree") for entry in entries]
    compared = [value for value in agree if value is not None]
    blocks = " (read around each block and summed: a restart zeroes them)" if any("blocks" in e for e in entries) else ""
    verdict = ("agree" if compared and all(compared) else
               f"differ at {compared.count(False)} of them" if compared else "could not be read")
    text = f"the server's Prometheus counters over the same load points{blocks} {verdict}"
    unread = len(agree) - len(compared)
    return text + (f"; {unread} point(s) not compared (a server could not be read after a block)" if unread else "")


def launch_notes(run: dict) -> list[str]:
    """What `evaluate --engine` launched: commands, versions, logs, pairing, restarts, exits."""
    launch = run.get("launch")
    if not launch:
        return []
    servers = launch["servers"]
    versions = sorted({server.get("version") or "version unknown" for server in servers})
    restarts = f", {launch['restarts']} restart(s)" if launch["pairing"] == "blocks" else ""
    notes = [f"Servers launched by specwise: {launch['engine']} {', '.join(versions)}, paired "
             f"{launch['pairing']}{restarts}. " + " ".join(
                 f"{server['arm']}: `{server['command']}` (log: {server['log']}, {server['starts']} start(s))."
                 for server in servers)]
    refused = [server["arm"] for server in servers if server.get("per_request_refused")]
    if refused:
        notes.append(f"The engine refused per-request acceptance (--per-request-spec-decode-metrics, vLLM 0.32 on) "
                     f"for {', '.join(refused)}: relaunched without it; their acceptance comes from the server's "
                     "Prometheus counters, per load point.")
    if launch.get("kv_cache"):
        notes.append(launch["kv_cache"] + ".")
    for server in servers:
        for exit_ in server.get("exits", []):
            notes.append(f"The server of {server['arm']} exited mid-run (exit code {exit_['code']}, start "
                         f"{exit_['start']}, at {exit_['time']}); its requests from then on count as errors. "
                         f"Its log ended: {' | '.join(exit_.get('last_lines') or [])}")
    if run.get("launch_error"):
        notes.append(f"Launch failed: {run['launch_error']}")
    if run.get("stopped"):
        notes.append(f"The run stopped early: {run['stopped']}.")
    return notes
