"""summary.md: the run, the recommendation, and the tables, as Markdown."""

from specwise.bench.report import tables
from specwise.bench.report.recommend import Recommendation
from specwise.bench.report.summary import Summary


def render_markdown(summary: Summary, recommendation: Recommendation) -> str:
    lines = [f"# specwise {summary.tool}: does speculative decoding pay?", ""]
    lines += [f"- {label}: {value}" for label, value in run_facts(summary)]
    lines += ["", "## Recommendation", ""]
    lines += recommendation_lines(recommendation)
    for table in (tables.results_table(summary), tables.speedup_table(summary, recommendation),
                  tables.category_table(summary, recommendation.metric), tables.acceptance_table(summary),
                  tables.errors_table(summary)):
        lines += _table(table)
    lines += ["## Notes", ""] + [f"- {note}" for note in summary.notes] + [""]
    return "\n".join(lines)


def run_facts(summary: Summary) -> list[tuple[str, str]]:
    run = summary.run
    facts = [("model", str(run.get("model", "?"))), ("machine", str(run.get("machine", "?"))),
             ("arms", ", ".join(arm["name"] for arm in summary.arms)), ("baseline", str(summary.baseline))]
    kernels = run.get("kernels")
    if kernels:
        facts.append(("engine", f"{kernels['dtype']}, linears: {kernels['linears']}, "
                                f"{'compiled' if kernels['compiled'] else 'eager (not the compiled graphs specwise serve runs)'}"
                                f" on {kernels['cpu']['isa']}"))
    workload = run.get("workload") or {}
    if workload:
        facts.append(("workload", f"{workload.get('source', '?')} ({workload.get('requests', '?')} requests)"))
    if summary.slo:
        facts.append(("SLO", ", ".join(f"{k} <= {v * 1000:g} ms" for k, v in summary.slo.items())))
    schedule = run.get("schedule") or {}
    if schedule.get("text"):
        facts.append(("schedule", schedule["text"]))
    criteria = run.get("criteria") or {}
    if criteria.get("confidence"):
        precision = criteria.get("precision")
        facts.append(("intervals", f"{criteria['confidence']:.0%} paired bootstrap over requests"
                      + (f"; rounds added until within +-{precision:.0%} or the time cap" if precision else "")))
    if run.get("started"):
        facts.append(("started", str(run["started"])))
    return facts


def recommendation_lines(recommendation: Recommendation) -> list[str]:
    lines = []
    for verdict in recommendation.verdicts:
        lines.append(f"- **{verdict.verdict}**")
        lines += [f"  - {note}" for note in verdict.category_notes]
    if not recommendation.verdicts:
        lines.append("- No arm to compare with the baseline at matching load points.")
    lines.append("")
    for config in recommendation.configs:
        lines += _config_lines(config)
    return lines


def _config_lines(config: dict) -> list[str]:
    status = "pays somewhere in this run" if config["pays"] else "did not pay in this run"
    lines = [f"### {config['spec']} (k={config['k']}, {status})", ""]
    if config.get("vllm_args"):
        lines += ["vLLM:", "", "```", config["vllm_args"], "```", ""]
    if config.get("vllm_dynamic_args"):
        lines += ["vLLM with a batch-size -> k table ([lo, hi, k]; k = 0 turns speculation off):", "",
                  "```", config["vllm_dynamic_args"], "```", ""]
    if config.get("sglang"):
        lines += ["SGLang:", "", "```", config["sglang"], "```", ""]
    if config.get("trtllm"):
        lines += ["TensorRT-LLM (LLM API; trtllm-serve: the YAML in --extra_llm_api_options):", "", "```",
                  config["trtllm"], "```", "", "```yaml", config["trtllm_yaml"], "```", ""]
    lines += [f"_{note}_" for note in (config.get("vllm_note"), config.get("sglang_note")) if note]
    return lines + [""]


def _table(table: tables.TableData) -> list[str]:
    if not table.rows:
        return []
    lines = [f"## {table.title}", "", "| " + " | ".join(table.header) + " |",
             "|" + "---|" * len(table.header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table.rows]
    if table.note:
        lines += ["", f"_{table.note}_"]
    return lines + [""]
