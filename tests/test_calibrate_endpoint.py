"""`specwise calibrate --endpoint URL`: a designed sweep against a server whose step time is a known
function (tests/fake_engine.py with FAKE_ENGINE_STEP_COST) recovers that function; a sweep too short
to fit, or too noisy, is refused in one line. The arithmetic by hand: test_calibrate_by_hand.py.
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

from specwise.bench.calibrate.command import _fit, parse_arms
from specwise.bench.calibrate.counts import NOISE_FACTOR
from specwise.bench.calibrate.samples import WaveSteps
from specwise.bench.calibrate.sweep import MAX_WINDOW_SEED, SweepDesign, Wave, _Windows
from specwise.bench.launch.command import free_port
from specwise.cli import main
from specwise.engine.cost.linear_cost import LinearStepCost, StepShape
from specwise.engine.cost.step_fit import StepSample
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
    # every batch size at the shortest prompt before any at a longer one: 64 x 32 before 16 x 256
    assert SweepDesign(batch_sizes=[4, 1], prompt_tokens=[100, 10], output_tokens=10).waves() == [
        (1, 10), (4, 10), (1, 100), (4, 100)]
    assert SweepDesign(batch_sizes=[1, 4, 16, 64], prompt_tokens=[256, 32]).waves() == [
        (1, 32), (4, 32), (16, 32), (64, 32), (1, 256), (4, 256), (16, 256), (64, 256)]
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
