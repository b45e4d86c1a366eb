"""`specwise calibrate --endpoint URL`: a designed sweep against a server whose step time is a known
function (tests/fake_engine.py with FAKE_ENGINE_STEP_COST) recovers that function; a sweep too short
to fit, or too noisy, is refused in one line; the wave arithmetic of bench/calibrate/samples.py by hand.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import numpy as np

from specwise.bench.calibrate.command import _fit, parse_arms, with_pairs_decided
from specwise.bench.calibrate.counts import NOISE_FACTOR, CountCost, count_cost, count_requests, paid
from specwise.bench.calibrate.samples import WaveSteps, prefill_sample, prompt_chunks, wave_steps
from specwise.bench.calibrate.sweep import MAX_WINDOW_SEED, Probe, SweepDesign, Wave, _Windows
from specwise.bench.launch.command import free_port
from specwise.bench.results import RequestRecord
from specwise.cli import main
from specwise.engine.cost.linear_cost import LinearStepCost, StepShape
from specwise.engine.cost.step_fit import FitOptions, StepSample
from specwise.engine.cost.step_profile import load_step_cost
from specwise.errors import ConfigError, InputError

FAKE = Path(__file__).parent / "fake_engine.py"
# the fake engine's step: 20 ms + 0.5 ms a row + 40 us a cached token read + 2 ms a sampled row
FIXED, PER_TOKEN, PER_KV, PER_ROW = 0.020, 0.0005, 0.00004, 0.002
SWEEP = ["--batch-sizes", "1,2,4,8", "--prompt-tokens", "16,256", "--output-tokens", "16",
         "--prefill-lens", "16,256,1024"]
# Recovered within 5%: the chunks' arrival times carry the machine's scheduling jitter. On the shared
# 2-core VM every coefficient came within 0.7% quiet and within 3.4% at load average 9.
TOLERANCE = 0.05
TOKEN_BUDGET = 256
SPECULATING_PAIR = [[], ["--speculative-config", '{"num_speculative_tokens": 3}',
                         "--per-request-spec-decode-metrics", "summary"]]


@pytest.fixture(scope="module")
def servers():
    """A plain and a speculating (k = 3) fake engine with the known step time; ended by PID."""
    yield from fake_engines(SPECULATING_PAIR)


@pytest.fixture(scope="module")
def chunking_server():
    """A plain fake engine that prefills a prompt longer than TOKEN_BUDGET in chunks, and does not say so."""
    yield from fake_engines([[]], FAKE_ENGINE_TOKEN_BUDGET=str(TOKEN_BUDGET))


@pytest.fixture(scope="module")
def slower_servers():
    """The same pair as `servers` with a step 3 ms dearer: the machine after it slowed down."""
    yield from fake_engines(SPECULATING_PAIR, fixed=FIXED + 0.003)


def fake_engines(flag_sets: list[list[str]], fixed: float = FIXED, **extra_env):
    """One fake engine per flag set, with the known step time (fixed: its fixed cost); ended by PID, even on
    failure."""
    env = dict(os.environ, FAKE_ENGINE_START_DELAY="0", FAKE_ENGINE_STEP_COST=f"{fixed},{PER_TOKEN},{PER_KV},{PER_ROW}",
               **extra_env)
    urls, processes = [], []
    try:
        for extra in flag_sets:
            port = free_port()
            processes.append(subprocess.Popen([sys.executable, str(FAKE), "serve", "m", "--port", str(port), *extra],
                                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            urls.append(f"http://127.0.0.1:{port}")
        for url, process in zip(urls, processes):
            wait_ready(url, process)
        yield urls
    finally:
        for process in processes:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


def flattened(linear: dict) -> dict:
    """A profile's fit with each standard error a key of its own (pytest.approx compares flat dicts only)."""
    return ({key: value for key, value in linear.items() if key != "standard_errors"}
            | {f"standard_errors.{key}": value for key, value in linear["standard_errors"].items()})


def wait_ready(url: str, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the fake engine exited"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} never answered")


def test_recovers_the_known_step_cost_of_a_plain_and_a_speculating_server(servers, tmp_path, capsys):
    path = tmp_path / "profile.json"
    plain, speculating = servers
    assert main(["calibrate", "--endpoint", plain, "--speculative-arm", f"ngram={speculating}", *SWEEP,
                 "--output", str(path)]) == 0
    out = capsys.readouterr().out
    data = json.loads(path.read_text())
    for fitted in (data["linear"], data["linear"]["drafting"]["ngram"]):
        assert fitted["fixed_s"] == pytest.approx(FIXED, rel=TOLERANCE)
        assert fitted["per_token_s"] == pytest.approx(PER_TOKEN, rel=TOLERANCE)
        assert fitted["per_kv_token_s"] == pytest.approx(PER_KV, rel=TOLERANCE)
        assert fitted["per_logits_row_s"] == pytest.approx(PER_ROW, rel=TOLERANCE)
        # the HTTP round trip and the prompt's handling, a few ms on loopback, never a step's worth
        assert 0 < fitted["request_overhead_s"] < FIXED
    assert "endpoint off: fitted linear:" in out and "endpoint ngram: fitted linear:" in out
    assert out.count("measured") == data["linear"]["steps"] + data["linear"]["drafting"]["ngram"]["steps"]
    waves = data["calibration"]["waves"]
    assert len(waves) == 16 and all(wave["errors"] == 0 for wave in waves)
    assert len(data["calibration"]["prefills"]) == 6
    # the speculating server's waves computed 1 + 3 rows per sequence each step
    assert {wave["tokens"] / wave["batch_size"] for wave in waves if wave["endpoint"] == "ngram"} == {4.0}
    cost = load_step_cost(path)                   # what simulate, calc and validate read
    assert isinstance(cost, LinearStepCost) and cost.for_method("ngram") is not cost
    assert cost.for_method("off") is cost and cost.request_overhead_s > 0


def test_a_server_that_prefills_in_chunks_is_fitted_by_its_token_budget(chunking_server, tmp_path, capsys):
    """The 1,024-token probes run four 256-token steps: with the server's budget given, the known cost comes
    back (and the profile keeps the budget for --refit); without it, the same server fits a line that
    misses its probes, and a line says the budget was not known."""
    path = tmp_path / "profile.json"
    assert main(["calibrate", "--endpoint", chunking_server[0], *SWEEP, "--max-num-batched-tokens",
                 str(TOKEN_BUDGET), "--output", str(path)]) == 0
    out = capsys.readouterr().out
    data = json.loads(path.read_text())
    fitted = data["linear"]
    for key, known in (("fixed_s", FIXED), ("per_token_s", PER_TOKEN), ("per_kv_token_s", PER_KV),
                       ("per_logits_row_s", PER_ROW)):
        assert fitted[key] == pytest.approx(known, rel=TOLERANCE), key
    assert "(4 steps)" in out and data["calibration"]["design"]["max_num_batched_tokens"] == TOKEN_BUDGET
    unknown, again = tmp_path / "unknown.json", tmp_path / "again.json"
    # a line: with the probes taken as one step each, the attention pairs (fitted by default then) would bend
    # it to the chunks' cost
    assert main(["calibrate", "--endpoint", chunking_server[0], *SWEEP, "--no-fit-attention-pairs",
                 "--output", str(unknown)]) == 0
    out = capsys.readouterr().out
    assert "the server does not say its token budget" in out and "(4 steps)" not in out
    assert json.loads(unknown.read_text())["linear"]["worst_residual"] > 0.05
    # --refit reads the budget the sweep recorded, or the one given
    assert main(["calibrate", "--refit", str(path), "--output", str(again)]) == 0
    assert flattened(json.loads(again.read_text())["linear"]) == pytest.approx(flattened(fitted))
    assert main(["calibrate", "--refit", str(unknown), "--max-num-batched-tokens", str(TOKEN_BUDGET),
                 "--output", str(again)]) == 0
    assert json.loads(again.read_text())["linear"]["fixed_s"] == pytest.approx(FIXED, rel=TOLERANCE)


GROUP, BLOCK, PER_GROUP = 4, 16, 0.010


@pytest.fixture(scope="module")
def grouped_server():
    """A plain fake engine that reads its cache as ours does (groups of GROUP in blocks of BLOCK, PER_GROUP a
    group) and says so on /health."""
    yield from fake_engines([[]], FAKE_ENGINE_GROUPED_READS=f"{GROUP},{BLOCK},{PER_GROUP}")


def test_a_server_that_reads_its_cache_in_padded_groups_is_fitted_as_it_reads(grouped_server, tmp_path, capsys):
    """The server says how it reads its cache: the waves' KV tokens are counted with the padding, the known
    cost comes back with what a group costs, and the profile keeps the reads. Refitted as if each
    sequence read its own cache (--kv-reads none), the same sweep has no group to cost: its batch-8 waves
    (two groups) and its prefills (none) cannot both be fitted."""
    path, own = tmp_path / "profile.json", tmp_path / "own.json"
    assert main(["calibrate", "--endpoint", grouped_server[0], *SWEEP, "--output", str(path)]) == 0
    assert f"reads its KV cache in groups of {GROUP}" in capsys.readouterr().out
    fitted = json.loads(path.read_text())["linear"]
    for key, known in (("fixed_s", FIXED), ("per_token_s", PER_TOKEN), ("per_kv_token_s", PER_KV),
                       ("per_logits_row_s", PER_ROW), ("per_attention_group_s", PER_GROUP)):
        assert fitted[key] == pytest.approx(known, rel=TOLERANCE), key
    assert fitted["kv_reads"] == {"group_size": GROUP, "block_size": BLOCK}
    assert isinstance(load_step_cost(path), LinearStepCost) and load_step_cost(path).kv_reads is not None
    assert main(["calibrate", "--refit", str(path), "--kv-reads", "none", "--output", str(own)]) == 0
    plain = json.loads(own.read_text())["linear"]
    assert "kv_reads" not in plain and "per_attention_group_s" not in plain
    assert plain["worst_residual"] > 2 * fitted["worst_residual"]
    assert main(["calibrate", "--refit", str(path), "--kv-reads", "16", "--output", str(own)]) == 2
    assert "GROUP/BLOCK" in capsys.readouterr().err


@pytest.fixture(scope="module")
def count_server():
    """A plain fake engine whose step of a row count not among the last COUNT_MEMORY costs NEW_COUNT more."""
    yield from fake_engines([[]], FAKE_ENGINE_COUNT_COST=f"{NEW_COUNT},{COUNT_MEMORY}")


NEW_COUNT, COUNT_MEMORY = 0.015, 16


def test_recovers_what_a_new_token_count_costs_and_how_many_the_server_keeps(count_server, tmp_path, capsys):
    """The count probe finds the fake engine's 15 ms and its memory of 16 counts; the fit, taking them as known,
    recovers the step's coefficients as on a server without the cost, and the simulator reads both back.
    With --no-count-cost the same sweep is fitted as before the probe existed, no count cost kept."""
    path, plain = tmp_path / "profile.json", tmp_path / "plain.json"
    assert main(["calibrate", "--endpoint", count_server[0], *SWEEP, "--count-probes", "20",
                 "--output", str(path)]) == 0
    out = capsys.readouterr().out
    data = json.loads(path.read_text())
    fitted, probe = data["linear"], data["calibration"]["counts"]["off"]
    # d_j is a difference of two single requests' TTFTs, each with the machine's jitter: beside two busy
    # loops the probe's standard error was 1.5-2.2 ms (0.3 quiet) and its estimates 13.1-16.8 ms over 8
    # runs. It must land within its own error bar, and within 5% when quiet.
    assert probe["noise_s"] < NEW_COUNT / NOISE_FACTOR
    assert abs(fitted["new_count_s"] - NEW_COUNT) <= max(TOLERANCE * NEW_COUNT, NOISE_FACTOR * probe["noise_s"])
    assert fitted["count_memory"] == COUNT_MEMORY
    for key, known in (("fixed_s", FIXED), ("per_token_s", PER_TOKEN), ("per_kv_token_s", PER_KV),
                       ("per_logits_row_s", PER_ROW)):
        assert fitted[key] == pytest.approx(known, rel=TOLERANCE), key
    assert 0 < fitted["request_overhead_s"] < NEW_COUNT
    assert f"a step of a token count not among the last 16 run costs {fitted['new_count_s'] * 1e3:.1f} ms more" in out
    assert probe["probed"] == 20
    cost = load_step_cost(path)
    assert (cost.new_count_s, cost.count_memory) == (fitted["new_count_s"], COUNT_MEMORY)
    assert main(["calibrate", "--refit", str(path), "--no-count-cost", "--output", str(plain)]) == 0
    without = json.loads(plain.read_text())["linear"]
    assert "new_count_s" not in without and not json.loads(plain.read_text())["calibration"]["counts"]
    assert without["fixed_s"] == pytest.approx(FIXED, rel=TOLERANCE)


def test_the_count_probe_by_hand():
    """counts.py's worked example: d = 12, 14, 11, 13, 1, -2, 0, 1 ms at j = 0..7 -> the step after j = 3,
    memory 8 counts, 12 ms. A drift over the probe (every later request slower) moves nothing: each revisit
    is held against the fresh count beside it. Every revisit quick: a cost with a memory of at least the
    probe's; none quick: no cost. The requests: distinct even counts, then each again beside itself + 1,
    token ids of each count, none of the counts to avoid."""
    def probe(d_ms, drift=0.0):
        """Fresh counts 40, 42, ... at 50 ms + 0.1 ms a token; revisit j quick by d_j; drift s a request."""
        m = len(d_ms)
        counts = [40 + 2 * i for i in range(m)]
        ttft = lambda n, i: 0.05 + 1e-4 * n + drift * i
        records = [record(i, i, ttft(n, i), 0.01, 1, prompt=n) for i, n in enumerate(counts)]
        for j, n in enumerate(counts[::-1]):
            i = m + 2 * j
            records += [record(i, i, ttft(n, i) - d_ms[j] / 1e3, 0.01, 1, prompt=n),
                        record(i + 1, i + 1, ttft(n + 1, i + 1), 0.01, 1, prompt=n + 1)]
        return records
    d = [12, 14, 11, 13, 1, -2, 0, 1]
    stepped = count_cost(probe(d))
    assert (stepped.new_count_s, stepped.memory, stepped.bounded) == (pytest.approx(0.012), 8, True)
    drifting = count_cost(probe(d, drift=0.002))
    assert (drifting.new_count_s, drifting.memory) == (pytest.approx(0.012), 8)
    rng = np.random.default_rng(0)
    kept = count_cost(probe(list(10 + rng.normal(0, 1, 24))))
    assert kept.new_count_s == pytest.approx(0.010, abs=0.001) and (kept.memory, kept.bounded) == (48, False)
    assert "keeps at least 48 counts" in kept.summary()
    assert count_cost(probe(list(rng.normal(0, 1, 24)))).new_count_s == 0
    assert count_cost(probe([12, 14, 1, 0])) is None                  # too few revisits
    assert count_cost(probe(d)[:-1]) is None                           # cut short by the budget
    requests = count_requests(20, seed=3, avoid={50, 51})
    counts = [r.prompt_tokens for r in requests]
    fresh, again = counts[:20], counts[20:]
    assert again[0::2] == fresh[::-1] and again[1::2] == [n + 1 for n in fresh[::-1]]
    assert len(set(counts)) == 40 and not {50, 51} & set(counts) and all(n % 2 == 0 for n in fresh)
    assert all(len(r.extra["prompt_token_ids"]) == r.prompt_tokens for r in requests)
    with pytest.raises(ConfigError, match="count-probes"):
        SweepDesign(count_probes=2)


def test_what_the_prefill_probes_paid_for_new_counts_by_hand():
    """counts.py `paid`'s worked example, memory 4: the probes' counts walked in order through the server's
    memory, each request its prompt's chunks."""
    cost = CountCost(0.01, 4, True, 20, 0.001)
    prompt = lambda n, error=None: record(0, 0, 0.1, 0.01, 1, prompt=n, error=error)
    assert paid([[prompt(16), prompt(16)], [prompt(16), prompt(32), prompt(16)]], cost, budget=None) == \
        [[0.01, 0.0], [0.0, 0.01, 0.0]]
    # five counts since 10 ran: forgotten, paid again; a failed request ran nothing
    assert paid([[prompt(n) for n in (10, 20, 30, 40, 50, 10)], [prompt(60, error="boom"), prompt(20)]], cost,
                budget=None) == [[0.01] * 6, [0.0, 0.01]]
    # a budget of 40: an 80-token prompt is two chunks of 40, one count; 100 is 40, 40, 20
    assert paid([[prompt(80), prompt(100)]], cost, budget=40) == [[0.01, 0.01]]


def test_a_sweep_too_short_to_fit_is_refused_in_one_line(servers, tmp_path, capsys):
    assert main(["calibrate", "--endpoint", servers[0], "--batch-sizes", "1", "--prompt-tokens", "16",
                 "--output-tokens", "16", "--prefill-lens", "16", "--prefill-repeats", "1",
                 "--output", str(tmp_path / "p.json")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("specwise: error: endpoint off: the sweep is too short to fit") and "\n" not in error
    assert not (tmp_path / "p.json").exists()
    # what it swept is kept for --refit (the same sweep refused the same way), and is no profile to simulate with
    kept = tmp_path / "p.refused.json"
    assert f"calibrate --refit {kept}" in error
    assert main(["calibrate", "--refit", str(kept), "--output", str(tmp_path / "again.json")]) == 2
    assert "the sweep is too short to fit" in capsys.readouterr().err
    with pytest.raises(InputError, match="a sweep calibrate could not fit"):
        load_step_cost(kept)


def test_a_server_that_does_not_answer_is_refused_before_the_sweep(tmp_path, capsys):
    assert main(["calibrate", "--endpoint", f"http://127.0.0.1:{free_port()}", "--output",
                 str(tmp_path / "p.json")]) == 2
    assert "does not answer" in capsys.readouterr().err


def test_a_noisy_sweep_is_refused_in_one_line():
    """Steps that scatter 30% around any straight line: the fit's median residual gives it away."""
    samples = [StepSample(StepShape.of([1] * b, [c] * b), (0.02 + 0.001 * b + 1e-5 * b * c) * noise)
               for (b, c), noise in zip([(b, c) for b in (1, 2, 4, 8) for c in (20, 150)],
                                        (1.3, 0.7, 0.7, 1.3, 1.3, 0.7, 0.7, 1.3))]
    waves = [Wave("off", 1, 16, [], WaveSteps(1, sample)) for sample in samples]
    with pytest.raises(ConfigError, match="too noisy to fit") as error:
        _fit("off", waves, [])
    assert "\n" not in str(error.value)


def test_bad_arms_and_designs_are_refused():
    assert parse_arms(["ngram=http://h:1"]) == {"ngram": "http://h:1"}
    for bad in (["ngram"], ["=http://h"], ["off=http://h"], ["ngram=http://a", "ngram=http://b"]):
        with pytest.raises(ConfigError):
            parse_arms(bad)
    with pytest.raises(ConfigError, match="output-tokens"):
        SweepDesign(output_tokens=4)
    assert SweepDesign(batch_sizes=[4, 1], prompt_tokens=[100, 10], output_tokens=10).waves() == [
        (1, 10), (4, 10), (1, 100), (4, 100)]
    with pytest.raises(InputError, match="unknown suite category"):
        SweepDesign(categories=["poetry"])


def test_a_wave_cuts_its_prompts_from_the_categories_in_turn():
    design = SweepDesign(categories=["code_editing", "chat", "translation"], output_tokens=8, window_seed=0)
    windows = _Windows(design)
    wave = windows.requests(7, 64, 8, "b7", turn=1)
    assert [r.category for r in wave] == ["chat", "translation", "code_editing", "chat", "translation",
                                         "code_editing", "chat"]
    assert [r.extra["category_text"] for r in wave] == [r.category for r in wave]
    assert len({r.prompt for r in wave}) == 7                  # the same category's windows differ
    assert all(r.ignore_eos and r.max_tokens == 8 and r.prompt_tokens == 64 for r in wave)
    assert "def " in "".join(r.prompt for r in wave if r.category == "code_editing")
    assert [r.category for r in windows.requests(1, 64, 1, "p", turn=2)] == ["translation"]
    probe = windows.requests(3, 256, 1, "p", turn=4, one_category=True)    # a prefill probe's repeats
    assert [r.category for r in probe] == ["chat"] * 3 and len({r.prompt for r in probe}) == 3


def test_no_two_requests_of_a_sweep_start_alike_and_each_sweep_starts_afresh():
    """A server runs a prompt it has seen (a token count, a prefix) faster than real traffic's new ones."""
    def sweep(seed):
        windows = _Windows(SweepDesign(categories=["chat", "code_editing"], window_seed=seed))
        prompts = [r.prompt for r in windows.requests(3, 256, 1, "p", one_category=True)]
        for batch_size in (1, 4, 16):
            prompts += [r.prompt for r in windows.requests(batch_size, 32, 8, "b")]
        return prompts
    first = sweep(0)
    assert len(set(first)) == len(first) == 24
    assert sweep(0) == first                                  # a seed repeats its sweep
    assert not set(sweep(100)) & set(first)                    # another seed, other windows
    assert all(0 <= SweepDesign().window_seed < MAX_WINDOW_SEED for _ in range(3))   # drawn when not given
    with pytest.raises(ConfigError, match="--window-seed"):
        SweepDesign(window_seed=-1)


def record(index: int, send: float, ttft: float, gap: float, chunks: int, prompt: int = 100, **counters):
    times = [ttft + gap * i for i in range(chunks)]
    return RequestRecord(arm="off", method="http", load_kind="concurrency", load_value=4, category="chat",
                         request_id=f"r{index}", prompt_tokens=prompt, output_tokens=counters.pop("output", chunks),
                         send_time=send, ttft=ttft, e2e=times[-1], chunk_times=times,
                         chunk_tokens=counters.pop("chunk_tokens", []), **counters)


def test_a_wave_by_hand():
    """4 requests sent at 0, prefilled in one step (first tokens all at 0.1 s), then 40 ms steps: the
    window runs from the step after 0.1 s (the first of four decodes, left out) to the first finish;
    KV = 4 x (100 + the tokens made mid-window - 1), and each decode row attends to its cache and itself:
    attention pairs = KV + 4."""
    records = [record(i, 0.0, 0.1, 0.04, 30) for i in range(4)]
    steps = wave_steps(records, 4)
    assert steps.decode.seconds == pytest.approx(0.04)
    assert steps.decode.tokens == 4 and steps.window_steps == 28
    assert steps.decode.kv_tokens == pytest.approx(4 * (100 + (2 + 30) / 2 - 1))
    assert steps.decode.pairs == pytest.approx(4 * (100 + (2 + 30) / 2 - 1) + 4)
    # staggered prefill: the window starts a step after the last first token
    late = [record(i, 0.0, 0.1 + 0.04 * i, 0.04, 30) for i in range(4)]
    staggered = wave_steps(late, 4)
    assert staggered.window_steps == 25
    assert staggered.decode.seconds == pytest.approx(0.04)
    # a lost request breaks the lockstep: no sample
    assert wave_steps(records[:3], 4).decode is None


def test_a_speculating_wave_by_hand():
    """Each request drafted 3 tokens a step over 10 decode steps and accepted 10 of 30: 21 tokens in
    11 chunks (the first from the prefill), rows 1 + 30 / 10 = 4 a step. Mid-window (0.375 s: the window
    runs from the second chunk, at 0.15 s, to the last) each had made 12 tokens: 100 + 12 - 1 = 111
    cached, 4 x 111 + 4 x 5 / 2 = 454 attention pairs. From the server's counters instead (no
    per-request ones), each request's share of the wave's."""
    own = [record(i, 0.0, 0.1, 0.05, 11, output=21, drafts=10, draft_tokens=30, accepted_tokens=10)
           for i in range(2)]
    steps = wave_steps(own, 2)
    assert steps.decode.seconds == pytest.approx(0.05) and steps.decode.tokens == pytest.approx(8)
    assert steps.decode.kv_tokens == pytest.approx(2 * 111) and steps.decode.pairs == pytest.approx(2 * 454)
    shared = [record(i, 0.0, 0.1, 0.05, 11, output=21) for i in range(2)]
    assert wave_steps(shared, 2, drafts=(60, 20)).decode.tokens == pytest.approx(8)


def test_a_prefill_is_the_median_ttft_of_single_requests():
    records = [record(i, i, ttft, 0.04, 2, prompt=256) for i, ttft in enumerate((0.31, 0.30, 0.45))]
    assert prefill_sample(records) == StepSample(StepShape(256, 0, 256 * 257 / 2), pytest.approx(0.31), logits_rows=1,
                                                 first_token=True)


def test_a_prompt_longer_than_the_token_budget_is_its_chunks_steps():
    """1,064 tokens at a budget of 512: chunks of 512, 512 and 40 over 0, 512 and 1,024 cached tokens,
    three steps; within the budget, one step as before."""
    records = [record(i, i, ttft, 0.04, 2, prompt=1064) for i, ttft in enumerate((0.78, 0.79, 0.80))]
    sample = prefill_sample(records, max_num_batched_tokens=512)
    pairs = 512 * 513 / 2 + (512 * 512 + 512 * 513 / 2) + (40 * 1024 + 40 * 41 / 2)
    assert sample == StepSample(StepShape(1064, 512 + 1024, pairs), pytest.approx(0.79), logits_rows=1,
                                first_token=True, steps=3)
    assert prefill_sample(records, max_num_batched_tokens=2048) == prefill_sample(records)
    assert prompt_chunks(1024, 512) == ([512, 512], [0, 512]) and prompt_chunks(100, None) == ([100], [0])
    with pytest.raises(ConfigError, match="max-num-batched-tokens"):
        SweepDesign(max_num_batched_tokens=0)


def test_merged_chunks_count_their_tokens():
    """A plain server that fell behind sent two steps' tokens in one chunk: steps are counted as tokens."""
    records = [record(i, 0.0, 0.1, 0.08, 15, output=29, chunk_tokens=[1] + [2] * 14) for i in range(2)]
    assert wave_steps(records, 2).decode.seconds == pytest.approx(0.04)


def test_a_recorded_sweep_is_refitted_without_a_server(servers, tmp_path, capsys):
    """The sweep's requests are kept beside the profile; --refit fits them again, to the same figures
    (and with --fit-attention-pairs, to that model), and refuses a file that is not such a profile."""
    path, again = tmp_path / "profile.json", tmp_path / "again.json"
    assert main(["calibrate", "--endpoint", servers[0], "--speculative-arm", f"ngram={servers[1]}", "--batch-sizes",
                 "1,4", "--prompt-tokens", "16,128", "--output-tokens", "12", "--prefill-lens", "16,256",
                 "--prefill-repeats", "1", "--output", str(path)]) == 0
    assert (tmp_path / "profile.requests.jsonl").exists()
    assert main(["calibrate", "--refit", str(path), "--output", str(again)]) == 0
    recorded, refitted = (json.loads(p.read_text())["linear"] for p in (path, again))
    assert flattened(refitted.pop("drafting")["ngram"]) == pytest.approx(flattened(recorded.pop("drafting")["ngram"]))
    assert flattened(refitted) == pytest.approx(flattened(recorded))
    assert "refitted from" in capsys.readouterr().out
    assert main(["calibrate", "--refit", str(tmp_path / "profile.requests.jsonl"), "--output", str(again)]) == 2
    assert "not a profile written by calibrate --endpoint" in capsys.readouterr().err


@pytest.fixture(scope="module")
def logging_servers():
    """The plain and speculating pair, each saying the steps it ran on GET /steps as `specwise serve` does."""
    yield from fake_engines(SPECULATING_PAIR, FAKE_ENGINE_STEP_LOG="1")


def test_a_server_that_says_its_steps_is_fitted_on_them(logging_servers, tmp_path, capsys):
    """Both servers say every step the sweep ran: fitted on those (and the probes' TTFTs for the request
    overhead), the known cost comes back within 2%, the speculating server's too (each step's own seconds:
    no chunk's arrival jitter, no window to infer). The steps are kept beside the profile: --refit fits them
    again to the same figures, --refit --no-server-steps fits what the client saw of them instead, and so does
    a refit beside a sweep that kept none (a line says so)."""
    path, again, client = tmp_path / "profile.json", tmp_path / "again.json", tmp_path / "client.json"
    plain, speculating = logging_servers
    assert main(["calibrate", "--endpoint", plain, "--speculative-arm", f"ngram={speculating}", *SWEEP,
                 "--output", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("during the sweep (GET /steps): they are fitted") == 2
    data = json.loads(path.read_text())
    kept = [json.loads(line) for line in (tmp_path / "profile.steps.jsonl").read_text().splitlines()]
    assert {line["endpoint"] for line in kept} == {"off", "ngram"}
    assert data["calibration"]["steps"] == "profile.steps.jsonl"
    probes = len(data["calibration"]["prefills"]) // 2
    for name, fitted in (("off", data["linear"]), ("ngram", data["linear"]["drafting"]["ngram"])):
        for key, known in (("fixed_s", FIXED), ("per_token_s", PER_TOKEN), ("per_kv_token_s", PER_KV),
                           ("per_logits_row_s", PER_ROW)):
            assert fitted[key] == pytest.approx(known, rel=0.02), (name, key)
        assert 0 < fitted["request_overhead_s"] < FIXED
        assert fitted["steps"] == sum(1 for line in kept if line["endpoint"] == name) + probes
    # every verification step fed 1 + 3 rows a sequence, as the speculating server said
    assert all(fed == 4 for line in kept if line["endpoint"] == "ngram" and not line["prompt_tokens"]
               for fed in line["fed"])
    assert "decodes, batch 8-16" in out        # the residuals by kind of step and batch size
    assert main(["calibrate", "--refit", str(path), "--output", str(again)]) == 0
    assert "decodes, batch 8-16" in capsys.readouterr().out
    recorded, refitted = (json.loads(p.read_text())["linear"] for p in (path, again))
    assert flattened(refitted.pop("drafting")["ngram"]) == pytest.approx(flattened(recorded.pop("drafting")["ngram"]))
    assert flattened(refitted) == pytest.approx(flattened(recorded))
    assert main(["calibrate", "--refit", str(path), "--no-server-steps", "--output", str(client)]) == 0
    assert "decodes, batch" not in capsys.readouterr().out
    seen = json.loads(client.read_text())["linear"]
    assert seen["steps"] == len(data["calibration"]["waves"]) // 2 + probes
    assert seen["fixed_s"] == pytest.approx(FIXED, rel=TOLERANCE)
    # fitted with a sweep that kept no steps: both as the client saw them, not one sweep's steps and the other's probes
    unlogged = tmp_path / "unlogged.json"
    unlogged.write_text(json.dumps(data | {"calibration": {key: value for key, value in data["calibration"].items()
                                                           if key != "steps"}}))
    assert main(["calibrate", "--refit", str(path), str(unlogged), "--output", str(client)]) == 0
    assert "ngram, off said its steps in some of these sweeps, not all" in capsys.readouterr().out
    assert json.loads(client.read_text())["linear"]["steps"] == 2 * seen["steps"]


def test_sweeps_at_two_times_are_refitted_as_one(servers, slower_servers, tmp_path, capsys):
    """--refit with two profiles fits their waves and probes together: sweeps of a machine whose step cost
    20 ms fixed and then 23 ms fit a fixed cost between the two; sweeps of other endpoints are refused.
    (Sweeps 20 and 30 ms apart are refused as one: their steps miss the one fit by 12%, median.)"""
    paths = [tmp_path / "before.json", tmp_path / "after.json"]
    for path, (plain, speculating) in zip(paths, (servers, slower_servers)):
        assert main(["calibrate", "--endpoint", plain, "--speculative-arm", f"ngram={speculating}",
                     "--batch-sizes", "1,4", "--prompt-tokens", "16,128", "--output-tokens", "12",
                     "--prefill-lens", "16,256", "--prefill-repeats", "1", "--output", str(path)]) == 0
    both = tmp_path / "both.json"
    assert main(["calibrate", "--refit", *map(str, paths), "--output", str(both)]) == 0
    assert f"refitted from {paths[0]}, {paths[1]}" in capsys.readouterr().out
    before, after, together = (json.loads(p.read_text()) for p in (*paths, both))
    assert before["linear"]["fixed_s"] < together["linear"]["fixed_s"] < after["linear"]["fixed_s"]
    for name in ("waves", "prefills"):
        assert len(together["calibration"][name]) == sum(len(one["calibration"][name]) for one in (before, after))
    assert together["linear"]["steps"] == before["linear"]["steps"] + after["linear"]["steps"]
    # a refit of that profile refits the two sweeps it was fitted from, to the same figures
    again = tmp_path / "again.json"
    assert main(["calibrate", "--refit", str(both), "--output", str(again)]) == 0
    assert json.loads(again.read_text())["linear"] == together["linear"]
    plain_only = tmp_path / "plain-only.json"
    plain_only.write_text(json.dumps(before | {"calibration": before["calibration"]
                                               | {"endpoints": {"off": servers[0]}}}))
    assert main(["calibrate", "--refit", str(paths[0]), str(plain_only), "--output", str(both)]) == 2
    assert "sweeps fitted together must sweep the same ones" in capsys.readouterr().err


def test_attention_pairs_are_fitted_where_the_server_prefilled_every_probe_whole():
    """calibrate --endpoint's default: pairs fitted for a server that ran each probe in one step (vLLM at its
    budget of 2,048), not for one that ran the longest in chunks (ours at 512); a flag given stands."""
    def probes(budget):
        return [Probe("off", n, [], prefill_sample_of(n, budget)) for n in (32, 256, 1024)]
    assert with_pairs_decided(FitOptions(), probes(2048)).fit_attention_pairs is True
    assert with_pairs_decided(FitOptions(), probes(512)).fit_attention_pairs is False
    assert with_pairs_decided(FitOptions(fit_attention_pairs=False), probes(2048)).fit_attention_pairs is False
    assert with_pairs_decided(FitOptions(fit_attention_pairs=True), probes(512)).fit_attention_pairs is True


def prefill_sample_of(prompt: int, budget: int) -> StepSample:
    record = RequestRecord(arm="off", method="off", load_kind="concurrency", load_value=1, category="chat",
                           request_id="prefill-p1-0", prompt_tokens=prompt, output_tokens=1, send_time=0.0, ttft=0.1)
    return prefill_sample([record], budget)
