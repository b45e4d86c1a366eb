"""report.html: one self-contained page (plots embedded as base64 PNG, inline CSS)."""

import base64
import html

from specwise.bench.report import plots, tables
from specwise.bench.report.recommend import Recommendation
from specwise.bench.report.markdown import run_facts
from specwise.bench.report.summary import Summary

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f0f0f0; } td:first-child, td:nth-child(2) { text-align: left; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; }
.note { color: #666; font-size: 0.85em; } img { max-width: 100%; }
li.verdict { font-weight: bold; } li.verdict ul { font-weight: normal; }
"""


def render_html(summary: Summary, recommendation: Recommendation) -> str:
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>specwise {summary.tool}</title>",
             f"<style>{STYLE}</style></head><body>",
             f"<h1>specwise {summary.tool}: does speculative decoding pay?</h1><ul>"]
    parts += [f"<li><b>{_e(label)}</b>: {_e(value)}</li>" for label, value in run_facts(summary)]
    parts.append("</ul><h2>Recommendation</h2>")
    parts.append(_recommendation(recommendation))
    parts.append(_plots(summary, recommendation))
    for table in (tables.results_table(summary), tables.speedup_table(summary, recommendation),
                  tables.category_table(summary, recommendation.metric), tables.acceptance_table(summary),
                  tables.errors_table(summary)):
        parts.append(_table(table))
    parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in summary.notes) + "</ul>")
    return "\n".join(parts + ["</body></html>"])


def _recommendation(recommendation: Recommendation) -> str:
    items = []
    for verdict in recommendation.verdicts:
        notes = "".join(f"<li>{_e(note)}</li>" for note in verdict.category_notes)
        items.append(f"<li class='verdict'>{_e(verdict.verdict)}<ul>{notes}</ul></li>")
    parts = ["<ul>" + "".join(items) + "</ul>"]
    for config in recommendation.configs:
        status = "pays somewhere in this run" if config["pays"] else "did not pay in this run"
        parts.append(f"<h3>{_e(config['spec'])} (k={config['k']}, {status})</h3>")
        for label, key in (("vLLM", "vllm_args"), ("vLLM with a batch-size &rarr; k table", "vllm_dynamic_args"),
                           ("SGLang", "sglang"), ("TensorRT-LLM (LLM API)", "trtllm"),
                           ("trtllm-serve --extra_llm_api_options YAML", "trtllm_yaml")):
            if config.get(key):
                parts.append(f"<p>{label}:</p><pre>{_e(config[key])}</pre>")
        for note in dict.fromkeys(n for n in (config.get("vllm_note"), config.get("sglang_note")) if n):
            parts.append(f"<p class='note'>{_e(note)}</p>")
    return "\n".join(parts)


def _plots(summary: Summary, recommendation: Recommendation) -> str:
    parts = ["<h2>Plots</h2>"]
    for kind in summary.load_kinds():
        parts.append(f"<h3>Latency vs {_e(kind)}</h3>" + _img(plots.latency_plot(summary, kind, recommendation.metric)))
        parts.append(f"<h3>Throughput vs {_e(kind)}</h3>" + _img(plots.throughput_plot(summary, kind)))
        if any(v.load_kind == kind for v in recommendation.verdicts):
            parts.append(f"<h3>Speedup vs {_e(kind)}, with the break-even line</h3>"
                         + _img(plots.speedup_plot(summary, recommendation, kind)))
    acceptance = plots.acceptance_plot(summary)
    if acceptance is not None:
        parts.append("<h3>Acceptance rate per category</h3>" + _img(acceptance))
    return "\n".join(parts)


def _img(png: bytes) -> str:
    return f"<img alt='plot' src='data:image/png;base64,{base64.b64encode(png).decode('ascii')}'>"


def _table(table: tables.TableData) -> str:
    if not table.rows:
        return ""
    head = "".join(f"<th>{_e(h)}</th>" for h in table.header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in table.rows)
    note = f"<p class='note'>{_e(table.note)}</p>" if table.note else ""
    return f"<h2>{_e(table.title)}</h2><table><tr>{head}</tr>{body}</table>{note}"


def _e(text) -> str:
    return html.escape(str(text))
