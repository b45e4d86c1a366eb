"""The official `openai` client against the real server on loopback (tiny model, ngram drafter)."""

import asyncio

import httpx
import openai
import pytest
from test_server_harness import MODEL, TINY_ENGINE, engine_idle, metric, serve, sse_payloads, wait_until
from tiny_models import tiny_checkpoint

from specwise.bench.load.targets.base import Acceptance
from specwise.bench.load.targets.http import ServerSays, announced
from specwise.bench.load.targets.per_request import vllm_acceptance
from specwise.engine.llm import LLM
from specwise.sampling_params import SamplingParams

PROMPT = "Once upon a time"
REPEATING = "abcabcabcabc"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def server():
    with serve() as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference():
    """Greedy outputs of the target alone (no drafter), through LLM.generate."""
    llm = LLM(checkpoint=tiny_checkpoint(), **{**TINY_ENGINE, "speculative": None})
    prompts = [PROMPT, REPEATING, CHAT]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    return {str(prompt): output for prompt, output in zip(prompts, outputs)}


def streamed_text(stream, chat: bool) -> tuple[str, list]:
    chunks = list(stream)
    pieces = [(c.choices[0].delta.content if chat else c.choices[0].text) or "" for c in chunks if c.choices]
    return "".join(pieces), chunks


@pytest.mark.parametrize("speculative", [True, False])
def test_completion_greedy_equals_llm_generate(client, reference, speculative):
    expected = reference[PROMPT]
    response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                         extra_body={"speculative": speculative})
    assert response.choices[0].text == expected.text
    assert response.choices[0].finish_reason == "length"
    assert response.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert response.usage.completion_tokens == MAX_TOKENS
    assert response.specwise["speculative"] is speculative


@pytest.mark.parametrize("speculative", [True, False])
def test_streamed_completion_greedy_equals_llm_generate(client, reference, speculative):
    stream = client.completions.create(model=MODEL, prompt=REPEATING, max_tokens=MAX_TOKENS, temperature=0,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"speculative": speculative})
    text, chunks = streamed_text(stream, chat=False)
    assert text == reference[REPEATING].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == MAX_TOKENS
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(final) == 1 and final[0].choices[0].finish_reason == "length"
    assert final[0].specwise["speculative"] is speculative
    if not speculative:
        assert final[0].specwise["drafts"] == 0


def test_chat_streamed_and_not_equal_llm_generate(client, reference):
    expected = reference[str(CHAT)].text
    response = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0)
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == expected
    assert response.usage.total_tokens == response.usage.prompt_tokens + MAX_TOKENS
    stream = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0,
                                            stream=True)
    text, chunks = streamed_text(stream, chat=True)
    assert text == expected
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)        # no usage chunk unless asked for


def test_raw_stream_ends_with_done(server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url("/v1/completions"), json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = sse_payloads(response.iter_lines())
    assert payloads[-1] == "[DONE]"
    assert all(p["object"] == "text_completion" for p in payloads[:-1])


def test_acceptance_figures_add_up_to_metrics(server, client):
    before = server.metrics()
    response = client.completions.create(model=MODEL, prompt=REPEATING * 3, max_tokens=48, temperature=0)
    after = server.metrics()
    figures = response.specwise
    for name, key in (("drafts", "drafts"), ("draft_tokens", "draft_tokens"), ("accepted_tokens", "accepted_tokens")):
        counter = f"specwise:spec_decode_num_{name}_total"
        assert metric(after, counter) - metric(before, counter) == figures[key]
    assert figures["drafts"] > 0
    assert sum(figures["accepted_per_position"]) == figures["accepted_tokens"]
    assert figures["mean_acceptance_length"] == pytest.approx(1 + figures["accepted_tokens"] / figures["drafts"])
    assert metric(after, "specwise:spec_decode_k") == TINY_ENGINE.get("num_speculative_tokens", 4)


def test_acceptance_also_in_vllms_per_request_shape(server, client):
    """metrics.speculative_decoding, as vLLM 0.32 returns it, read back by the evaluator's reader."""
    response = client.completions.create(model=MODEL, prompt=REPEATING * 3, max_tokens=48, temperature=0)
    figures, shaped = response.specwise, response.metrics["speculative_decoding"]
    assert figures["drafts"] > 0 and sum(shaped["acceptance_histogram"]) == figures["drafts"]
    assert vllm_acceptance(response.metrics) == Acceptance(figures["drafts"], figures["draft_tokens"],
                                                           figures["accepted_tokens"], figures["accepted_per_position"])
    body = {"model": MODEL, "prompt": REPEATING * 3, "max_tokens": 48, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url("/v1/completions"), json=body, timeout=60) as streamed:
        payloads = sse_payloads(streamed.iter_lines())
    last = next(p for p in payloads if isinstance(p, dict) and "metrics" in p)
    assert last["metrics"]["speculative_decoding"] == shaped        # greedy: the same drafts again


def test_stop_string_truncates_like_the_engine(client, reference):
    text = reference[PROMPT].text
    stop = next(char for char in text[1:] if char.isascii() and char.isalnum())
    response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stop=stop)
    assert response.choices[0].text == text[:text.index(stop)]
    assert response.choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats(client):
    def sample():
        return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=1.0, top_p=0.9,
                                         seed=7, extra_body={"top_k": 50}).choices[0].text
    assert sample() == sample()


def test_token_id_prompt_and_chat_defaults(client, server):
    response = client.completions.create(model=MODEL, prompt=[72, 105], max_tokens=4, temperature=0)
    assert response.usage.prompt_tokens == 2
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                          max_completion_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 3


def test_steps_say_what_the_engine_ran(server, client):
    """GET /steps: the steps the engine ran, numbered, from `after` on (`calibrate --endpoint` takes the next
    number with limit=0 before its sweep and reads the sweep's steps after it). One request alone: its prompt
    in one step, then one row a step (no drafts asked) until its 24th token; a bad number is refused."""
    wait_until(lambda: engine_idle(server.engine), what="engine idle")
    mark = httpx.get(server.url("/steps"), params={"limit": 0}).json()
    assert mark["steps"] == []
    response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                         extra_body={"speculative": False})
    said = httpx.get(server.url("/steps"), params={"after": mark["next"]}).json()
    steps = said["steps"]
    assert len(steps) == said["next"] - mark["next"] == MAX_TOKENS
    assert (steps[0]["fed"], steps[0]["cached"]) == ([response.usage.prompt_tokens], [0])
    assert [line["fed"] for line in steps[1:]] == [[1]] * (MAX_TOKENS - 1)
    assert [line["cached"][0] for line in steps[1:]] == list(range(response.usage.prompt_tokens,
                                                                    response.usage.prompt_tokens + MAX_TOKENS - 1))
    assert all(line["seconds"] > 0 for line in steps)
    assert httpx.get(server.url("/steps"), params={"after": -1}).status_code == 400


def test_models_health_metrics(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    engine = server.engine
    budget, reads, seqs = engine.config.max_num_batched_tokens, engine.runner.kv_reads, engine.config.max_num_seqs
    kv_tokens = engine.block_manager.num_blocks * reads.block_size
    assert httpx.get(server.url("/health")).json() == {"status": "ok", "forward": "eager",
                                                        "max_num_batched_tokens": budget,
                                                        "kv_reads": {"group_size": 16, "block_size": reads.block_size},
                                                        "max_num_seqs": seqs, "block_size": reads.block_size,
                                                        "kv_cache_tokens": kv_tokens}
    # what calibrate --endpoint and evaluate (for simulate --validate) read
    said = asyncio.run(announced(server.url("/v1")))
    assert said == ServerSays(budget, reads, seqs, reads.block_size, kv_tokens)
    assert said.limits() == {"max_num_seqs": seqs, "max_num_batched_tokens": budget, "block_size": reads.block_size,
                             "kv_cache_tokens": kv_tokens}
    wait_until(lambda: engine_idle(server.engine), what="engine idle")
    samples = server.metrics()
    assert metric(samples, "specwise:kv_cache_blocks_used") == 0
    assert metric(samples, "specwise:kv_cache_blocks_free") == server.engine.block_manager.num_blocks
    assert metric(samples, "specwise:requests_total", route="/v1/completions", status=200) > 0
    assert metric(samples, "specwise:spec_decode_info", method="ngram", policy="static") == 1
    assert ("specwise:forward_compiled", frozenset()) in samples and metric(samples, "specwise:forward_compiled") == 0
