"""`--compile`: the model's forward compiled by inductor (models/compile/graphs.py) runs every kind of step.

On a tiny random fp32 target:
  - a step mixing a first prompt chunk, a later chunk, decodes and verification rows gives the eager
    forward's logits (within fp32 rounding);
  - steps of 1-4 tokens, padded to a bucket's static graph, give the eager logits and KV cache (the
    padding rows write no slot);
  - steps of any token count after the warm-up compile nothing more (a graph per bucket, one dynamic;
    the same for the LM head, whatever the number of rows sampled, none included);
  - greedy decoding with speculation (n-gram, layer_skip, whose shorter forward is a third graph, suffix,
    lookahead's draft trees) is token for token the compiled engine's output without it, in a continuous
    batch (serve compiles by default); layer_skip's graphs are compiled when it is set up, not by its
    first requests.
  - the graphs are kept on disk (models/compile/cache.py): a second engine with the same settings loads
    every one and compiles none, a corrupt package is compiled again with a note, and greedy outputs are
    the same either way; an entry made for other settings is emptied with a note; each setting the
    graphs depend on changes the entry; an engine with compile unset (None) takes the cached graphs, and runs
    eagerly where the cache holds none for its settings; loading them leaves nothing unpacked in the temp dir.
"""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from capability_marks import cpu_kernels, needs_cxx
from specwise.engine.llm import LLM
from specwise.models import capabilities
from specwise.models.checkpoints.loader import build_model
from specwise.models.compile import cache as compile_cache, graphs as compiled_module
from specwise.models.compile.cache import CompileCache, entry_key
from specwise.sampling_params import SamplingParams
from tiny_models import tiny_checkpoint

pytestmark = [needs_cxx, cpu_kernels]          # inductor writes and builds C++

ENGINE = dict(dtype="float32", num_kv_blocks=256, block_size=4, max_model_len=128, max_num_batched_tokens=512)
PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return", "x",
           "The quick brown fox jumps over the lazy dog. The quick brown fox", "Numbers: 12345, 2024-06-01"]


@pytest.fixture(scope="module")
def checkpoint():
    return tiny_checkpoint(num_layers=3)


@pytest.fixture(scope="module")
def compiled(checkpoint):
    return LLM(checkpoint=checkpoint, compile=True, **ENGINE)


def graphs(llm) -> int:
    """The compiled graphs the engine holds: one it had to make in the middle of a step would add one."""
    return len(llm.engine.runner.forward_fn.runs)


def mixed_step(runner):
    """Prompts of 9 and 5 tokens prefilled, then one step: a new 6-token prompt, the second 4 tokens of
    a 10-token prompt, one decode and a verification of 3 drafts. Returns the step's logits."""
    tables = [list(range(8 * i, 8 * i + 8)) for i in range(4)]
    runner.forward([list(range(1, 10)), list(range(20, 25)), list(range(40, 46))], [0, 0, 0], tables[:3],
                   [1, 1, 0])
    return runner.forward([list(range(60, 66)), list(range(46, 50)), [9], [5, 6, 7, 8]], [0, 6, 9, 5],
                          [tables[3], tables[2], tables[0], tables[1]], [1, 1, 1, 4])


def test_compiled_step_matches_eager_logits(checkpoint, compiled):
    eager = LLM(checkpoint=checkpoint, **ENGINE)
    expected, got = mixed_step(eager.engine.runner), mixed_step(compiled.engine.runner)
    assert got.shape == expected.shape == (7, checkpoint.config.vocab_size)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_padded_steps_match_eager_logits_and_cache(checkpoint, compiled):
    """Three decodes (3 tokens: bucket 4, one padding row), then a verification of 2 drafts (bucket 4)."""
    eager = LLM(checkpoint=checkpoint, **ENGINE)
    results = []
    for llm in (eager, compiled):
        runner = llm.engine.runner
        runner.kv_cache.zero_()
        tables = [list(range(8 * i, 8 * i + 8)) for i in range(3)]
        runner.forward([list(range(1, 10)), list(range(20, 25)), list(range(40, 46))], [0, 0, 0], tables, [0, 0, 0])
        decoded = runner.forward([[9], [25], [46]], [9, 5, 6], tables, [1, 1, 1])
        verified = runner.forward([[10, 11, 12]], [10], tables[:1], [3])
        results.append((decoded, verified, runner.kv_cache.clone()))
    for expected, got in zip(*results):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_layer_skip_depth_runs_its_own_graph(checkpoint, compiled):
    """The compiled forward over the first layer only (a layer-skip drafter's) gives eager's first-layer
    hidden states, at a bucket and in the dynamic graph: the depth selects its graph."""
    eager = LLM(checkpoint=checkpoint, **ENGINE)
    results = []
    for llm in (eager, compiled):
        runner = llm.engine.runner
        tables = [list(range(8 * i, 8 * i + 8)) for i in range(2)]
        prefill = runner.hidden_states([list(range(1, 10)), list(range(20, 25))], [0, 0], tables, num_layers=1)
        decode = runner.hidden_states([[9], [25]], [9, 5], tables, num_layers=1)
        results.append((prefill, decode))
    for expected, got in zip(*results):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_no_recompilation_after_warm_up(compiled):
    before = graphs(compiled)
    runner = compiled.engine.runner
    for num_seqs in (1, 2, 3, 5, 8):
        tables = [list(range(8 * i, 8 * i + 8)) for i in range(num_seqs)]
        # prompt chunks that sample nothing: no logits rows
        none = runner.forward([[7] * (3 + i) for i in range(num_seqs)], [0] * num_seqs, tables, [0] * num_seqs)
        assert none.shape == (0, runner.model.config.vocab_size)
        runner.forward([[8] for _ in range(num_seqs)], [3 + i for i in range(num_seqs)], tables, [1] * num_seqs)
    assert graphs(compiled) == before


def test_layer_skip_graphs_compile_when_the_drafter_is_set_up(compiled):
    """A layer-skip drafter's shorter forward is compiled when it is chosen, so its first requests
    (a server's first clients) do not wait minutes: once it is set up every graph of its depth is there, and
    generating with it compiles nothing more. (Depth 1, as the other layer-skip tests here: its four graphs
    are compiled once, by whichever of them runs first.)"""
    forward_fn = compiled.engine.runner.forward_fn
    compiled.engine.set_speculative("layer_skip:1", 3)
    compiled_at_set_up = graphs(compiled)
    assert set(forward_fn.graph_set.graphs(1)) <= set(forward_fn.runs)
    drafts = compiled.engine.stats.drafts
    compiled.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert compiled.engine.stats.drafts > drafts
    assert graphs(compiled) == compiled_at_set_up
    compiled.engine.set_speculative(None, 0)


@pytest.mark.parametrize("speculative", ["ngram", "layer_skip:1", "suffix", "lookahead"])
def test_greedy_speculation_under_compile_equals_plain(checkpoint, compiled, speculative):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    compiled.engine.set_speculative(None, 0)
    expected = [out.output_token_ids for out in compiled.generate(PROMPTS, params)]
    compiled.engine.set_speculative(speculative, 3)
    drafts = compiled.engine.stats.drafts
    got = [out.output_token_ids for out in compiled.generate(PROMPTS, params)]
    assert compiled.engine.stats.drafts > drafts
    assert got == expected
    compiled.engine.set_speculative(None, 0)


@pytest.fixture
def compile_calls(monkeypatch):
    """Graphs compiled while the test runs (each a call of compiled.compile_graph)."""
    calls = []
    compile_graph = compiled_module.compile_graph

    def counted(module, example, dynamic_shapes, autotune, path):
        calls.append(path)
        compile_graph(module, example, dynamic_shapes, autotune, path)

    monkeypatch.setattr(compiled_module, "compile_graph", counted)
    return calls


def greedy(llm) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    return [out.output_token_ids for out in llm.generate(PROMPTS, params)]


def test_a_second_engine_loads_every_graph_from_the_cache(checkpoint, compiled, compile_calls, capfd):
    compiled.engine.set_speculative(None, 0)
    second = LLM(checkpoint=checkpoint, compile=True, **ENGINE)
    assert compile_calls == [] and second.engine.runner.forward_fn.num_compiled == 0
    assert "loaded 8 compiled graphs" in capfd.readouterr().err
    assert greedy(second) == greedy(compiled)


def test_unset_compile_takes_the_cached_graphs_else_runs_eagerly(checkpoint, compiled, compile_calls):
    """compile=None (evaluate's and serve's engine): the graphs when the cache holds them, compiling nothing;
    for settings it holds none for (another max_model_len: other rope tables), eager, naming the graphs to compile."""
    compiled.engine.set_speculative(None, 0)
    cached = LLM(checkpoint=checkpoint, compile=None, **ENGINE)
    assert cached.engine.compiled and cached.engine.pending_compile is None
    assert cached.engine.kernel_line.endswith(", compiled") and cached.engine.kernels["compiled"]
    other = LLM(checkpoint=checkpoint, compile=None, **dict(ENGINE, max_model_len=96))
    assert not other.engine.compiled and other.engine.kernel_line.endswith(", eager")
    assert other.engine.pending_compile.count() == 8 and not other.engine.pending_compile.cached()
    assert compile_calls == []
    assert greedy(cached) == greedy(compiled)


def test_a_corrupt_cached_graph_is_compiled_again_with_a_note(checkpoint, compiled, compile_calls, capfd):
    compiled.engine.set_speculative(None, 0)
    cache = compiled.engine.runner.forward_fn.cache
    package = cache.path("logits-1")
    data = bytearray(package.read_bytes())
    for offset in range(len(data) // 3, len(data) // 3 + 10):     # inside the compiled code or its constants
        data[offset] ^= 0xFF
    package.write_bytes(bytes(data))
    again = LLM(checkpoint=checkpoint, compile=True, **ENGINE)
    err = capfd.readouterr().err
    assert len(compile_calls) == 1 and again.engine.runner.forward_fn.num_compiled == 1
    assert f"the cached graph {package} does not load (its checksum does not match)" in err
    assert "compiling the LM head's 1-row graph (5 of 8)" in err
    assert greedy(again) == greedy(compiled)


def test_an_entry_made_for_other_settings_is_emptied_with_a_note(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path))
    key = {"weights": "abc", "threads": 1}
    first = CompileCache(key)
    first.store("forward-1", lambda path: open(path, "wb").write(b"graph"))
    assert first.path("forward-1").is_file() and capfd.readouterr().err == ""
    assert CompileCache(key).path("forward-1").is_file()          # the same settings: kept
    (first.directory / "key.json").write_text(json.dumps({"weights": "other", "threads": 1}))
    reopened = CompileCache(key)
    assert reopened.directory == first.directory and not reopened.path("forward-1").exists()
    assert "was made for other settings" in capfd.readouterr().err


def test_the_cache_is_off_when_asked(monkeypatch):
    monkeypatch.setenv(compile_cache.ENV, "off")
    cache = CompileCache({"weights": "abc"})
    assert not cache.kept and compile_cache.cache_root() is None


def test_every_setting_the_graphs_depend_on_changes_the_entry(checkpoint, monkeypatch):
    model = build_model(checkpoint, torch.float32, "cpu", 64, plain=True)          # as the compile worker builds it
    base = entry_key(model, torch.float32, (1, 2, 4))
    assert entry_key(model, torch.float32, (1, 2, 4)) == base
    other_weights = build_model(checkpoint, torch.float32, "cpu", 64, plain=True)
    other_weights.layers[0].mlp.down_proj.weight.data[0, 0] += 1
    changed = [entry_key(other_weights, torch.float32, (1, 2, 4)), entry_key(model, torch.bfloat16, (1, 2, 4)),
               entry_key(model, torch.float32, (1, 2))]
    caps = capabilities.cpu_capabilities()
    for other_cpu in (dataclasses.replace(caps, isa="NO AVX"),
                      dataclasses.replace(caps, onednn_bf16=not caps.onednn_bf16)):
        with monkeypatch.context() as patch:
            patch.setattr(capabilities, "cpu_capabilities", lambda: other_cpu)
            changed.append(entry_key(model, torch.float32, (1, 2, 4)))
    with monkeypatch.context() as patch:
        patch.setattr(torch, "get_num_threads", lambda: 7)
        changed.append(entry_key(model, torch.float32, (1, 2, 4)))
    with monkeypatch.context() as patch:
        patch.setattr(torch, "__version__", "0.0")
        changed.append(entry_key(model, torch.float32, (1, 2, 4)))
    assert all(key != base for key in changed)
    assert len({json.dumps(key, sort_keys=True) for key in changed}) == len(changed)


def test_holds_says_whether_every_graph_is_there_and_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "cache"))
    key = {"weights": "abc", "threads": 1}
    assert not compile_cache.holds(key, ["forward-1"]) and not (tmp_path / "cache").exists()
    entry = CompileCache(key)
    assert not compile_cache.holds(key, ["forward-1"])
    entry.store("forward-1", lambda path: open(path, "wb").write(b"graph"))
    assert compile_cache.holds(key, ["forward-1"]) and not compile_cache.holds(key, ["forward-1", "forward-2"])
    assert not compile_cache.holds({"weights": "other", "threads": 1}, ["forward-1"])
    (entry.directory / "forward-1.pt2.sha1").unlink()                 # a package without its checksum is not used
    assert not compile_cache.holds(key, ["forward-1"])
    monkeypatch.setenv(compile_cache.ENV, "off")
    assert not compile_cache.holds(key, [])


@pytest.mark.skipif(not Path(compiled_module.PROC_MAPS).is_file(), reason="no /proc/self/maps to find them by")
def test_loaded_graphs_leave_nothing_unpacked_in_the_temp_dir(checkpoint, compiled, compile_calls, monkeypatch,
                                                              tmp_path):
    """The loader unpacks each package under the temp dir and removes it only when freed, which a killed server or
    the compile worker (os._exit) never did: while the engine serves, its graphs' directories are gone already."""
    compiled.engine.set_speculative(None, 0)
    monkeypatch.setenv("TMPDIR", str(tmp_path))                # where the loader unpacks (it reads TMPDIR)
    second = LLM(checkpoint=checkpoint, compile=True, **ENGINE)
    assert compile_calls == [] and len(second.engine.runner.forward_fn.loaded) == 8
    assert list(tmp_path.iterdir()) == []
    assert greedy(second) == greedy(compiled)
