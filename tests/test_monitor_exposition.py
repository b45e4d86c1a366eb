"""The monitor's reader: a real vLLM 0.32 exposition, per-window rates from two of them, our own
server scraped live, counter resets, and one-line messages for pages it cannot use."""

from pathlib import Path

import httpx
import pytest

from specwise.monitor.exposition import ExpositionError, parse_snapshot
from specwise.monitor.scrape import ScrapeError, scrape
from specwise.monitor.window import since_start, window_between

DATA = Path(__file__).parent / "data"
VLLM = (DATA / "vllm-0.32-cpu-ngram-metrics.txt").read_text()
# the same page with the speculative counters, generation tokens and running requests raised by hand
VLLM_LATER = (DATA / "vllm-0.32-cpu-ngram-metrics-later.txt").read_text()


def test_real_vllm_exposition_is_read():
    snapshot = parse_snapshot(VLLM, time=100.0)
    assert snapshot.server == "vllm"
    counters = snapshot.acceptance
    assert (counters.drafts, counters.draft_tokens, counters.accepted_tokens) == (2583, 10332, 6125)
    assert counters.accepted_per_position == [1910, 1588, 1403, 1224]
    assert (snapshot.generation_tokens, snapshot.running, snapshot.waiting) == (12379, 0, 0)


def test_rates_from_two_expositions_equal_the_hand_computed_deltas():
    window = window_between("http://vllm/metrics", parse_snapshot(VLLM, 100.0), parse_snapshot(VLLM_LATER, 160.0))
    # by hand: 2683-2583, 10732-10332, 6365-6125, per position 1990-1910, 1648-1588, 1453-1403, 1274-1224
    assert (window.stats.drafts, window.stats.draft_tokens, window.stats.accepted_tokens) == (100, 400, 240)
    assert window.stats.accepted_per_position == [80, 60, 50, 50]
    assert window.acceptance_rate == pytest.approx(240 / 400)
    assert window.mean_acceptance_length == pytest.approx(1 + 240 / 100)
    assert window.per_position_acceptance == pytest.approx([0.8, 0.6, 0.5, 0.5])
    assert window.draft_tokens_per_draft == pytest.approx(4.0)
    assert window.generation_tokens == 12719 - 12379
    assert window.drafts_per_step == pytest.approx(100 / (340 - 240))
    assert window.output_tokens_per_s == pytest.approx(340 / 60)
    assert window.running == 3 and window.seconds == 60
    assert not window.reset and window.error is None


def test_the_whole_fixture_agrees_with_its_readme():
    """Acceptance rate 59.3%, mean acceptance length 3.37, from a zero start."""
    zero = parse_snapshot(VLLM.replace("} 2583.0", "} 0").replace("} 10332.0", "} 0").replace("} 6125.0", "} 0")
                          .replace("} 1910.0", "} 0").replace("} 1588.0", "} 0").replace("} 1403.0", "} 0")
                          .replace("} 1224.0", "} 0").replace("} 12379.0", "} 0"), 0.0)
    window = window_between("u", zero, parse_snapshot(VLLM, 10.0))
    assert round(window.acceptance_rate, 3) == 0.593
    assert round(window.mean_acceptance_length, 2) == 3.37


def test_a_counter_going_down_restarts_the_window_without_negative_rates():
    later, earlier = parse_snapshot(VLLM_LATER, 100.0), parse_snapshot(VLLM, 160.0)   # restart: counters fell
    window = window_between("u", later, earlier)
    assert window.reset and window.stats is None and window.acceptance_rate is None
    assert window.generation_tokens is None
    after_restart = window_between("u", earlier, parse_snapshot(VLLM_LATER, 220.0))   # next window: from new values
    assert not after_restart.reset and after_restart.stats.drafts == 100


def test_torn_scrape_keeps_totals_and_drops_positions():
    torn = VLLM_LATER.replace('position="3"} 1274.0', 'position="3"} 1250.0')
    window = window_between("u", parse_snapshot(VLLM, 0.0), parse_snapshot(torn, 60.0))
    assert window.acceptance_rate == pytest.approx(0.6) and window.mean_acceptance_length == pytest.approx(3.4)
    assert window.per_position_acceptance is None and window.notes


@pytest.mark.parametrize("page, message", [
    ("<html><body>Not found</body></html>", "not a Prometheus exposition"),
    ('{"status": "ok"}', "not a Prometheus exposition"),
    ("", "empty page"),
    ("# TYPE up gauge\nup 1\n", "no vllm:, sglang: or specwise: metrics"),
    ("\n".join(line for line in VLLM.splitlines() if "spec_decode" not in line),
     "vllm exports no speculative decoding metrics"),
])
def test_pages_it_cannot_use_give_one_line_messages(page, message):
    with pytest.raises(ExpositionError, match=message) as error:
        parse_snapshot(page, 0.0, where="http://x/metrics")
    assert "\n" not in str(error.value)


def test_a_first_scrape_gives_the_lifetime_figures():
    """What --once shows at once: the counters as read, i.e. a window from zero, with no duration."""
    lifetime = since_start("u", parse_snapshot(VLLM, 10.0))
    assert (lifetime.stats.drafts, lifetime.stats.draft_tokens, lifetime.stats.accepted_tokens) == (2583, 10332, 6125)
    assert round(lifetime.acceptance_rate, 3) == 0.593 and round(lifetime.mean_acceptance_length, 2) == 3.37
    assert lifetime.per_position_acceptance == pytest.approx([1910 / 2583, 1588 / 2583, 1403 / 2583, 1224 / 2583])
    assert lifetime.drafts_per_step == pytest.approx(2583 / (12379 - 6125))
    assert lifetime.generation_tokens == 12379 and lifetime.output_tokens_per_s is None
    assert not lifetime.reset and not lifetime.notes


def test_sglang_gauges_are_reported_as_read():
    page = ("# TYPE sglang:spec_accept_rate gauge\nsglang:spec_accept_rate{tp_rank=\"0\"} 0.55\n"
            "# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length{tp_rank=\"0\"} 3.2\n"
            "# TYPE sglang:num_requests_running gauge\nsglang:num_requests_running{tp_rank=\"0\"} 7\n"
            "# TYPE sglang:generation_tokens counter\nsglang:generation_tokens_total{tp_rank=\"0\"} 500\n")
    first = parse_snapshot(page, 0.0)
    second = parse_snapshot(page.replace("} 500", "} 800").replace("} 0.55", "} 0.5"), 10.0)
    assert first.server == "sglang"
    window = window_between("u", first, second)
    assert window.acceptance_rate == 0.5 and window.mean_acceptance_length == 3.2
    assert window.generation_tokens == 300 and window.running == 7
    lifetime = since_start("u", first)                                  # the server's own averages, as read
    assert (lifetime.acceptance_rate, lifetime.mean_acceptance_length, lifetime.stats) == (0.55, 3.2, None)


def test_unreachable_url_is_a_scrape_error():
    with httpx.Client() as client, pytest.raises(ScrapeError, match="cannot connect"):
        scrape(client, "http://127.0.0.1:9/metrics", timeout=2)


def test_non_200_and_non_prometheus_answers():
    def handler(request):
        if request.url.path == "/missing":
            return httpx.Response(404, text="no")
        return httpx.Response(200, text="<html>hello</html>")
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ScrapeError, match="HTTP 404"):
            scrape(client, "http://server/missing")
        with pytest.raises(ScrapeError, match="not a Prometheus exposition"):
            scrape(client, "http://server/metrics")


def test_our_own_server_scraped_live():
    from test_server_harness import serve, tiny_engine
    with serve() as server, httpx.Client() as client:
        before = scrape(client, server.url("/metrics"))
        assert before.server == "specwise" and before.acceptance.drafts == 0
        answer = httpx.post(server.url("/v1/completions"), timeout=60, json={
            "model": "tiny", "prompt": "abc abc abc abc abc abc", "max_tokens": 24, "temperature": 0})
        assert answer.status_code == 200
        after = scrape(client, server.url("/metrics"))
    window = window_between(server.url("/metrics"), before, after)
    engine_stats = server.engine.stats
    assert window.server == "specwise"
    assert window.stats.drafts == engine_stats.drafts and window.stats.draft_tokens == engine_stats.draft_tokens
    assert window.stats.accepted_tokens == engine_stats.accepted_tokens
    assert window.generation_tokens == answer.json()["usage"]["completion_tokens"]


def test_our_server_without_speculation_says_so():
    from test_server_harness import serve, tiny_engine
    with serve(tiny_engine(speculative=None)) as server, httpx.Client() as client:
        with pytest.raises(ScrapeError, match="specwise exports no speculative decoding metrics"):
            scrape(client, server.url("/metrics"))
