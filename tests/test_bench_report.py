"""`specwise report`: rendering any results directory (evaluate's or the simulator's)."""

import json
import re

import pytest

from specwise.bench.report.render import render_report
from specwise.bench.results import RequestRecord, read_records, read_run_info, write_run_info
from specwise.bench.report.summary import summarize
from specwise.errors import InputError

ARMS = [{"name": "off", "method": "off", "spec": None, "k": 0},
        {"name": "ngram-k4", "method": "ngram", "spec": "ngram", "k": 4}]


def records(arm: str, concurrency: int, tpot: float, accepted_per_draft: float | None):
    """Ten 21-token requests per category, sent back to back in `concurrency` lanes."""
    out = []
    for index in range(10 * concurrency):
        for category in ("code_editing", "chat"):
            ttft, tokens = 0.05, 21
            e2e = ttft + tpot * (tokens - 1)
            spec = {} if accepted_per_draft is None else dict(
                drafts=10, draft_tokens=40, accepted_tokens=int(10 * accepted_per_draft),
                accepted_per_position=[5, 3, 1, 1])
            out.append(RequestRecord(
                arm=arm, method=arm.split("-")[0], load_kind="concurrency", load_value=concurrency,
                category=category, request_id=f"{category}-{index}", prompt_tokens=100, output_tokens=tokens,
                send_time=(index // concurrency) * e2e, ttft=ttft, e2e=e2e,
                chunk_times=[ttft + tpot * i for i in range(tokens)], chunk_tokens=[1] * tokens, **spec))
    return out


def write_results(tmp_path):
    write_run_info(tmp_path, {"tool": "simulate", "model": "SmolLM2-135M", "machine": "modelled H100",
                              "arms": ARMS, "slo": {"ttft": 0.5}})
    warm = RequestRecord("off", "off", "concurrency", 1, "chat", "warm", 5, 5, 0.0, 0.1, 9.0, warmup=True)
    every = (records("off", 1, 0.040, None) + records("off", 8, 0.050, None)
             + records("ngram-k4", 1, 0.025, 2.0) + records("ngram-k4", 8, 0.060, 2.0) + [warm])
    (tmp_path / "requests.jsonl").write_text("".join(record.to_json() + "\n" for record in every))
    return tmp_path


@pytest.fixture
def results_dir(tmp_path):
    return write_results(tmp_path)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    return render_report(write_results(tmp_path_factory.mktemp("results")))


# ngram-k4: 0.040 / 0.025 = 1.6x at concurrency 1, 0.050 / 0.060 = 0.83x at 8:
# break-even at 8 ** (0.6 / (1.6 - 0.833)) = 5.09 on a log scale
VERDICT = "ngram-k4 pays at concurrency 1; break-even near concurrency 5.09."


def test_renders_all_three_files(rendered):
    files = rendered
    assert files.recommendation_lines == [VERDICT]
    summary = json.loads(files.summary_json.read_text())
    assert summary["tool"] == "simulate" and summary["baseline"] == "off"
    overall = [r for r in summary["rows"] if r["category"] == "all" and r["arm"] == "ngram-k4"]
    assert overall[0]["speedup"]["tpot_mean"] == pytest.approx(0.040 / 0.025)
    assert overall[0]["metrics"]["acceptance"]["rate"] == pytest.approx(0.5)
    assert overall[0]["metrics"]["acceptance"]["mean_length"] == pytest.approx(3.0)
    assert summary["recommendation"]["verdicts"][0]["pays_at"] == [1]


def test_markdown_has_the_answer_and_the_tables(rendered):
    markdown = rendered.summary_md.read_text()
    assert f"**{VERDICT}**" in markdown
    assert "pays on chat (1.60x, acceptance 50%), code_editing (1.60x, acceptance 50%)" in markdown
    assert "--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 4" in markdown
    assert "--speculative-algorithm NGRAM --speculative-num-draft-tokens 5" in markdown
    assert "| ngram-k4 | concurrency 1 | 20 | 0 |" in markdown
    assert "chunk-level" in markdown and "1 warm-up request(s) excluded" in markdown
    assert "- machine: modelled H100" in markdown


def test_html_is_self_contained_with_plots(rendered):
    page = rendered.report_html.read_text()
    assert page.count("data:image/png;base64,") == 4      # latency, throughput, speedup, acceptance
    assert not re.search(r"""(src|href)=['"]?(https?:)?//""", page)
    assert "break-even" in page and "<table>" in page


def test_half_written_last_line_is_ignored(results_dir):
    with open(results_dir / "requests.jsonl", "a") as file:
        file.write('{"arm": "off", "method": "of')
    summary = summarize(read_records(results_dir), read_run_info(results_dir))
    assert summary.row("off", "concurrency", 1).metrics.completed == 20


def test_nothing_finished_is_a_clear_error(tmp_path):
    write_run_info(tmp_path, {"tool": "evaluate", "arms": ARMS})
    (tmp_path / "requests.jsonl").write_text("")
    with pytest.raises(InputError, match="no finished requests"):
        render_report(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        render_report(tmp_path / "elsewhere")


def test_report_command(results_dir, capsys):
    from specwise.cli import main
    assert main(["report", str(results_dir), "--margin", "0.7"]) == 0
    out = capsys.readouterr().out
    assert "ngram-k4 does not pay at any measured concurrency" in out      # 1.6x < 1.7x
    assert f"report: {results_dir / 'report.html'}" in out
