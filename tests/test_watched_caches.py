"""What a long-running server watches: the caches that outlive requests are bounded and shown on /metrics
(suffix decoding's response cache in tokens, compiled grammars), and the grammar cache keeps the most
recently used."""

import httpx
from test_server_harness import MODEL, engine_idle, metric, serve, tiny_engine, wait_until
from tiny_models import tiny_checkpoint

from specwise.engine.sampling import grammar
from specwise.engine.sampling.grammar import GrammarCompiler
from specwise.sampling_params import StructuredOutput


def test_the_grammar_cache_keeps_the_most_recently_used(monkeypatch):
    checkpoint = tiny_checkpoint()
    compiler = GrammarCompiler(checkpoint.tokenizer, checkpoint.config.vocab_size)
    monkeypatch.setattr(grammar, "MAX_CACHED_GRAMMARS", 2)
    compiled, text_of = [], grammar.grammar_text
    monkeypatch.setattr(grammar, "grammar_text", lambda spec: (compiled.append(spec.value), text_of(spec))[1])
    a, b, c = (StructuredOutput("regex", pattern) for pattern in ("a+", "b+", "c+"))
    for spec in (a, b, a, c):          # a used again after b: c's arrival drops b
        compiler.check(spec)
    assert compiler.num_cached == 2
    compiler.check(a)
    compiler.check(b)
    assert compiled == ["a+", "b+", "c+", "b+"]


def test_metrics_show_the_suffix_cache_and_the_grammar_cache():
    engine = tiny_engine(speculative="suffix")
    with serve(engine) as server:
        before = server.metrics()
        assert metric(before, "specwise:spec_decode_cache_tokens") == 0
        assert metric(before, "specwise:structured_output_grammars_cached") == 0
        body = {"model": MODEL, "prompt": "abcabcabc", "max_tokens": 6, "ignore_eos": True}
        assert httpx.post(server.url("/v1/completions"), json=body, timeout=60).status_code == 200
        schema = {**body, "response_format": {"type": "json_object"}}
        assert httpx.post(server.url("/v1/completions"), json=schema, timeout=60).status_code == 200
        wait_until(lambda: engine_idle(engine), what="engine idle")
        after = server.metrics()
        cached = engine.proposer.cache.num_tokens
        assert cached > 0
        assert metric(after, "specwise:spec_decode_cache_tokens") == cached
        assert metric(after, "specwise:structured_output_grammars_cached") == 1
