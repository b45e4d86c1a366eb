"""`specwise report DIR`: (re-)render summary.json, summary.md and report.html from a
results directory written by `evaluate` or `simulate` (run.json + requests.jsonl).
"""

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from specwise.bench.report.recommend import DEFAULT_MARGIN, DEFAULT_METRIC, DEFAULT_THROUGHPUT_FLOOR, recommend
from specwise.bench.report.html import render_html
from specwise.bench.report.markdown import render_markdown
from specwise.bench.results import read_records, read_run_info
from specwise.bench.report.summary import summarize
from specwise.errors import InputError


@dataclass
class ReportFiles:
    summary_json: Path
    summary_md: Path
    report_html: Path
    recommendation_lines: list[str]


def render_report(results_dir, pay_metric: str | None = None, margin: float | None = None,
                  throughput_floor: float | None = None) -> ReportFiles:
    """Criteria default to those stored in run.json by the run, then to the defaults."""
    results_dir = Path(results_dir)
    run = read_run_info(results_dir)
    records = read_records(results_dir)
    if not any(not record.warmup for record in records):
        raise InputError(f"{results_dir}: no finished requests to report yet")
    criteria = run.get("criteria") or {}
    summary = summarize(records, run)
    recommendation = recommend(
        summary, metric=pay_metric or criteria.get("pay_metric", DEFAULT_METRIC),
        margin=_first(margin, criteria.get("margin"), DEFAULT_MARGIN),
        throughput_floor=_first(throughput_floor, criteria.get("throughput_floor"), DEFAULT_THROUGHPUT_FLOOR))
    data = summary.to_dict()
    data["recommendation"] = dataclasses.asdict(recommendation)
    files = ReportFiles(results_dir / "summary.json", results_dir / "summary.md", results_dir / "report.html",
                        [verdict.verdict for verdict in recommendation.verdicts])
    files.summary_json.write_text(json.dumps(data, indent=2), encoding="utf-8")
    files.summary_md.write_text(render_markdown(summary, recommendation), encoding="utf-8")
    files.report_html.write_text(render_html(summary, recommendation), encoding="utf-8")
    return files


def _first(*values):
    return next(value for value in values if value is not None)
