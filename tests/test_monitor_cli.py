"""`specwise monitor` end to end, in bounded loops: mock servers (httpx.MockTransport) with a fake
clock, our own server on loopback, cron-style --once with a state file, exit codes, the JSONL
log, the webhook, the dashboard and the Prometheus alerting rules."""

import io
import json
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from specwise.cli import main
from specwise.monitor.config import MonitorConfig
from specwise.monitor.drift import Baseline
from specwise.monitor.loop import run_monitor

URL = "http://vllm.test/metrics"
HOOK = "http://hooks.test/alert"


def vllm_page(drafts, draft_tokens, accepted, per_position, generated, running=2, waiting=0) -> str:
    labels = 'engine="0",model_name="m"'
    lines = ["# TYPE vllm:spec_decode_num_drafts counter", f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}",
             "# TYPE vllm:spec_decode_num_draft_tokens counter",
             f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {draft_tokens}",
             "# TYPE vllm:spec_decode_num_accepted_tokens counter",
             f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted}",
             "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {count}'
              for i, count in enumerate(per_position)]
    lines += ["# TYPE vllm:generation_tokens counter", f"vllm:generation_tokens_total{{{labels}}} {generated}",
              "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{labels}}} {running}",
              "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{labels}}} {waiting}"]
    return "\n".join(lines) + "\n"


def pages(window_rates, drafts=100, running=2):
    """Cumulative pages: window i has `drafts` drafts of k = 4 accepting 4 * drafts * rate tokens,
    spread over positions as evenly as prefix-wise acceptance allows."""
    pages_, totals, per_position, generated = [], [0, 0, 0], [0, 0, 0, 0], 0
    pages_.append(vllm_page(0, 0, 0, per_position, 0, running))
    for rate in window_rates:
        accepted = round(4 * drafts * rate)
        whole, rest = divmod(accepted, drafts)
        add = [drafts] * whole + [rest] + [0] * (3 - whole)
        per_position = [a + b for a, b in zip(per_position, add[:4])]
        totals = [totals[0] + drafts, totals[1] + 4 * drafts, totals[2] + accepted]
        generated += accepted + drafts
        pages_.append(vllm_page(*totals, per_position, generated, running))
    return pages_


class FakeServers:
    """MockTransport handler: GET URL serves the next page; POST HOOK is recorded."""

    def __init__(self, page_list):
        self.pages = list(page_list)
        self.served = 0
        self.posts = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            self.posts.append(json.loads(request.content))
            return httpx.Response(204)
        page = self.pages[min(self.served, len(self.pages) - 1)]
        self.served += 1
        return httpx.Response(200, text=page)


class FakeClock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def monitor(page_list, console=None, **settings):
    servers, clock = FakeServers(page_list), FakeClock()
    config = MonitorConfig(**{"metrics_url": [URL], "dashboard": False, **settings})
    out = console or Console(file=io.StringIO(), width=200)
    code = run_monitor(config, out, clock=clock, sleep=clock.sleep, transport=httpx.MockTransport(servers))
    return code, servers, out.file.getvalue()


def test_drift_alert_logged_posted_and_exit_code_1(tmp_path):
    rates = [0.6, 0.62, 0.58, 0.61, 0.59] * 2 + [0.6] * 5 + [0.3] * 5      # baseline 10 windows, drop at 16
    code, servers, text = monitor(pages(rates), baseline_windows=10, max_windows=len(rates),
                                  log=str(tmp_path / "m.jsonl"), webhook=HOOK, interval=60)
    assert code == 1
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(records) == len(rates)
    assert records[0]["acceptance_rate"] == pytest.approx(0.6) and records[0]["drafts"] == 100
    assert records[0]["seconds"] == pytest.approx(60)
    drift = [r for r in records if r["events"]]
    assert len(drift) == 1 and drift[0]["events"][0]["kind"] == "drift" and drift[0]["acceptance_rate"] == 0.3
    assert records.index(drift[0]) == 15                                     # the first window at 0.3
    assert [post["kind"] for post in servers.posts] == ["drift"]
    assert servers.posts[0]["window"]["acceptance_rate"] == 0.3
    assert "DRIFT: http://vllm.test/metrics: acceptance rate fell to 0.300" in text


def test_stationary_stream_exits_0_and_too_busy_exits_1():
    rates = [0.6, 0.62, 0.58, 0.61, 0.59] * 3
    code, _, _ = monitor(pages(rates), baseline_windows=5, max_windows=len(rates))
    assert code == 0
    code, servers, text = monitor(pages(rates, running=20), baseline_windows=5, max_windows=6, break_even=8,
                                  webhook=HOOK)
    assert code == 1 and "too busy to pay" in text and [p["kind"] for p in servers.posts] == ["too_busy"]


def test_saved_baseline_then_reused(tmp_path):
    rates = [0.6, 0.62, 0.58, 0.61, 0.59]
    path = tmp_path / "baseline.json"
    code, _, text = monitor(pages(rates), baseline_windows=5, max_windows=5, save_baseline=str(path))
    assert code == 0 and "baseline saved" in text
    assert Baseline.load(path).acceptance_rate == pytest.approx(0.6)
    code, _, _ = monitor(pages([0.3, 0.3]), baseline=str(path), max_windows=2)
    assert code == 1


def test_once_with_a_state_file_continues_between_runs(tmp_path):
    state, baseline = tmp_path / "state.json", tmp_path / "b.json"
    Baseline(0.6, 0.02, 20).save(baseline)
    all_pages = pages([0.6, 0.6, 0.3])
    results = []
    for run in range(3):   # run 0 scrapes twice (no state yet), later runs once each
        servers, clock = FakeServers(all_pages[run + (run > 0):]), FakeClock()
        config = MonitorConfig(metrics_url=[URL], once=True, state=str(state), baseline=str(baseline), interval=60)
        out = Console(file=io.StringIO(), width=200)
        results.append((run_monitor(config, out, clock=clock, sleep=clock.sleep,
                                    transport=httpx.MockTransport(servers)), servers.served, out.file.getvalue()))
    assert [(code, served) for code, served, _ in results] == [(0, 2), (0, 1), (1, 1)]
    assert "acceptance 0.300" in results[2][2]
    assert json.loads(state.read_text())["targets"][URL]["detector"]["alarmed"] is True


def test_once_without_state_shows_the_lifetime_figures_before_waiting_the_window():
    """The first scrape of a real vLLM page prints the server's figures since it started at once;
    the window's line comes after the (fake) --interval sleep."""
    data = Path(__file__).parent / "data"
    servers = FakeServers([(data / "vllm-0.32-cpu-ngram-metrics.txt").read_text(),
                           (data / "vllm-0.32-cpu-ngram-metrics-later.txt").read_text()])
    clock, out, shown_before_sleeping = FakeClock(), Console(file=io.StringIO(), width=300), []

    def sleep(seconds):
        shown_before_sleeping.append((seconds, servers.served, out.file.getvalue()))
        clock.sleep(seconds)

    config = MonitorConfig(metrics_url=[URL], once=True, interval=60)
    assert run_monitor(config, out, clock=clock, sleep=sleep, transport=httpx.MockTransport(servers)) == 0
    [(seconds, scrapes, before)] = shown_before_sleeping
    assert seconds == 60 and scrapes == 1 and servers.served == 2
    assert before.splitlines() == [
        f"{URL} (vllm, since the server started): acceptance 0.593, mean length 3.37, per position "
        "0.74 0.61 0.54 0.47, drafts/step 0.41, concurrency 0, drafts 2583 (10332 draft tokens, 6125 accepted), "
        "output tokens 12379",
        f"{URL}: the first window's figures follow in 60 s, at the next scrape"]
    after = out.file.getvalue()[len(before):].splitlines()
    assert after == [f"{URL} (vllm, 60 s): acceptance 0.600, mean length 3.40, per position 0.80 0.60 0.50 0.50, "
                     "drafts/step 1.00, concurrency 3, output tok/s 5.7"]


def test_failed_scrapes_are_reported_and_exit_3(capsys):
    code = main(["monitor", "--metrics-url", "http://127.0.0.1:9/metrics", "--max-windows", "2",
                 "--interval", "0.01", "--timeout", "2", "--no-dashboard"])
    out = capsys.readouterr()
    assert code == 3
    assert "scrape failed: http://127.0.0.1:9/metrics: cannot connect" in out.out
    assert "Traceback" not in out.out + out.err


def test_a_page_without_counters_then_recovery():
    no_spec = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
    good = pages([0.6, 0.6])
    code, _, text = monitor([no_spec, good[0], good[1], good[2]], baseline_windows=5, max_windows=2)
    assert "vllm exports no speculative decoding metrics" in text
    assert code == 0                     # the last window was read


@pytest.mark.parametrize("argv, message", [
    (["monitor"], "give --metrics-url"),
    (["monitor", "--metrics-url", URL, "--baseline", "/nonexistent/b.json", "--once"], "cannot read the baseline"),
    (["monitor", "--metrics-url", URL, "--break-even", "4", "--results", "x"], "not both"),
    (["monitor", "--metrics-url", URL, "--state", "s.json"], "add --once"),
])
def test_bad_flags_give_one_line_errors(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_live_dashboard_renders(tmp_path):
    console = Console(file=io.StringIO(), width=220, force_terminal=True)
    code, _, text = monitor(pages([0.6] * 6), console=console, dashboard=True, baseline_windows=5, max_windows=6,
                            break_even=1)
    assert "specwise monitor: window 6" in text and "0.600 (0.600)" in text and "TOO BUSY" in text
    assert "since the server started; first window in 60 s" in text           # the first frame, at once
    assert code == 1


def test_our_own_server_monitored_live(tmp_path):
    from test_server_harness import serve
    with serve() as server:
        httpx.post(server.url("/v1/completions"), timeout=60, json={
            "model": "tiny", "prompt": "abc abc abc abc abc abc", "max_tokens": 16, "temperature": 0})
        log = tmp_path / "live.jsonl"
        code = main(["monitor", "--metrics-url", server.url("/metrics"), "--max-windows", "2", "--interval", "0.2",
                     "--no-dashboard", "--log", str(log)])
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert code == 0 and len(records) == 2 and records[0]["server"] == "specwise" and records[0]["error"] is None


def test_alert_rules_are_valid_yaml_with_the_documented_thresholds(tmp_path, capsys):
    yaml = pytest.importorskip("yaml")
    Baseline(0.6, 0.03 / 1.370695978117311, 20).save(tmp_path / "b.json")   # sigma used = 0.03
    assert main(["monitor", "--alert-rules", "--baseline", str(tmp_path / "b.json"), "--break-even", "10.1"]) == 0
    rules = yaml.safe_load(capsys.readouterr().out)["groups"][0]["rules"]
    drop, busy = rules
    assert drop["alert"] == "SpeculativeAcceptanceDrop" and drop["expr"].endswith("< 0.5250")
    assert "rate(vllm:spec_decode_num_accepted_tokens_total[4m])" in drop["expr"]
    assert busy["alert"] == "SpeculationTooBusyToPay" and busy["expr"].endswith("[3m:]) > 10.1")
    assert main(["monitor", "--alert-rules", "--server", "sglang", "--baseline-rate", "0.5"]) == 0
    sglang = yaml.safe_load(capsys.readouterr().out)["groups"][0]["rules"]
    assert "sglang:spec_accept_rate" in sglang[0]["expr"]
