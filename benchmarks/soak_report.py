"""soak.py's outputs: the per-minute rows as CSV and JSON, the issue's targets checked, and a plot.

Targets (issue 33), with windows scaled down for runs shorter than an hour:
  - RSS: the largest after minute R (R = 5, or a third of a shorter run) within 5% of RSS at minute R;
  - KV: 0 blocks in use at every idle check (traffic paused, nothing admitted);
  - latency: TTFT and TPOT p99 of the steady clients' streams in the last W minutes within 10% of the
    first W minutes' (W = 10, or a third of a shorter run), at the same load (the same schedule of
    bursts, hang-ups, kills and malformed requests in both windows);
  - status: no request without one (lost = 0).
"""

import csv
import json
from pathlib import Path

import numpy as np

RSS_GROWTH_LIMIT = 0.05
LATENCY_DRIFT_LIMIT = 0.10


def percentile_ms(values: list[float], q: float) -> float | None:
    return float(np.percentile(np.array(values) * 1000, q)) if values else None


def checks(rows: list[dict], streams: list[tuple[float, float, float]], idle_checks: list[dict], minutes: int,
           lost: int) -> dict:
    """streams: (minute as a float, ttft s, tpot s) of every steady stream that finished with 200."""
    reference = min(5, max(1, minutes // 3))
    window = min(10, max(1, minutes // 3))
    rss_at = rows[reference - 1]["rss_mb"] if len(rows) >= reference else None
    rss_after = max((row["rss_mb"] for row in rows[reference:]), default=rss_at)
    growth = None if rss_at is None else (rss_after - rss_at) / rss_at
    first = [s for s in streams if s[0] < window]
    last = [s for s in streams if minutes - window <= s[0] < minutes]     # not the drain after the end

    def ratio(column: int) -> float | None:
        early, late = percentile_ms([s[column] for s in first], 99), percentile_ms([s[column] for s in last], 99)
        return None if not early or late is None else late / early

    ttft_ratio, tpot_ratio = ratio(1), ratio(2)
    return {
        "rss_reference_minute": reference, "rss_at_reference_mb": rss_at, "rss_max_after_mb": rss_after,
        "rss_growth": growth, "rss_ok": growth is not None and growth <= RSS_GROWTH_LIMIT,
        "idle_checks": idle_checks, "kv_zero_when_idle": bool(idle_checks) and
        all(check["kv_blocks_used"] == 0 for check in idle_checks),
        "latency_window_minutes": window, "streams_first_window": len(first), "streams_last_window": len(last),
        "ttft_p99_first_ms": percentile_ms([s[1] for s in first], 99),
        "ttft_p99_last_ms": percentile_ms([s[1] for s in last], 99),
        "tpot_p99_first_ms": percentile_ms([s[2] for s in first], 99),
        "tpot_p99_last_ms": percentile_ms([s[2] for s in last], 99),
        "ttft_p99_ratio": ttft_ratio, "tpot_p99_ratio": tpot_ratio,
        "latency_ok": ttft_ratio is not None and tpot_ratio is not None and
        ttft_ratio <= 1 + LATENCY_DRIFT_LIMIT and tpot_ratio <= 1 + LATENCY_DRIFT_LIMIT,
        "lost": lost, "status_ok": lost == 0,
    }


def write(out: Path, rows: list[dict], summary: dict) -> None:
    with open(out / "soak.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "soak.json").write_text(json.dumps({**summary, "minutes": rows}, indent=1))


def plot(out: Path, rows: list[dict], title: str) -> str:
    """soak.png, or the reason there is none."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed in this environment"
    minutes = [row["minute"] for row in rows]
    figure, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    axes[0].plot(minutes, [row["rss_mb"] for row in rows], marker=".")
    axes[0].set_ylabel("server RSS, MiB")
    axes[1].plot(minutes, [row["kv_blocks_used"] for row in rows], marker=".", label="KV blocks in use")
    axes[1].plot(minutes, [row["suffix_cache_tokens"] / 100 for row in rows], marker=".",
                 label="suffix cache, 100 tokens")
    axes[1].plot(minutes, [row["grammars_cached"] for row in rows], marker=".", label="grammars cached")
    axes[1].legend(fontsize=8)
    for column in ("n_200", "n_hung_up", "n_429", "n_4xx", "n_5xx", "n_killed", "n_lost"):
        axes[2].plot(minutes, [row[column] for row in rows], marker=".", label=column[2:])
    axes[2].set_ylabel("requests / minute")
    axes[2].legend(fontsize=8, ncol=4)
    for column in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms"):
        axes[3].plot(minutes, [row[column] if row[column] is not None else np.nan for row in rows], marker=".",
                     label=column[:-3])
    axes[3].set_yscale("log")
    axes[3].set_ylabel("steady streams, ms")
    axes[3].set_xlabel("minute")
    axes[3].legend(fontsize=8, ncol=4)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(out / "soak.png", dpi=90)
    return str(out / "soak.png")
