"""The engine seam on a tiny random model: sampling, stopping, batching, preemption, abort, bad input."""

import math

import pytest
import torch

from conftest import TINY_ENGINE
from specwise.config import DECODE_STEP_TOKENS, EngineConfig
from specwise.engine.llm import LLM
from specwise.engine.sampling.sampler import SamplingTensors, logits_to_probs, sample
from specwise.errors import ConfigError, InputError
from specwise.sampling_params import SamplingParams
from tiny_models import tiny_checkpoint

PROMPTS = ["Hello, world", "abc", "The quick brown fox jumps", "x", "0123456789", "def f(x): return x"]


def greedy(max_tokens: int = 12, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kwargs)


def drain(engine, max_steps: int = 2000, after_each_step=lambda: None) -> dict:
    """Step until nothing is in flight; every RequestOutput, per request id, in order."""
    streams = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return streams
        for output in engine.step():
            streams.setdefault(output.request_id, []).append(output)
        after_each_step()
    raise AssertionError(f"still unfinished after {max_steps} steps")


def first_ascii_pair(text: str, start: int) -> str:
    """The first two printable ASCII characters in a row at or after `start` that occur nowhere earlier."""
    for index in range(start, len(text) - 1):
        pair = text[index:index + 2]
        if all(" " <= c <= "~" for c in pair) and text.find(pair) == index:
            return pair
    raise AssertionError(f"no ASCII pair in {text!r}")


def visible(text: str) -> str:
    # random bytes: an output may end inside a UTF-8 character, which is not pinned down here
    return text.rstrip("\ufffd")


def probs_of(logits, temperature=1.0, top_k=0, top_p=1.0) -> torch.Tensor:
    logits = torch.tensor([logits], dtype=torch.float32)
    return logits_to_probs(logits, SamplingTensors.build([temperature], [top_k], [top_p]))[0]


# --- sampler: logits -> the distribution we sample from ----------------------------------------------------------

LOG_P = [math.log(p) for p in (0.4, 0.3, 0.2, 0.1)]


def test_temperature_one_is_the_softmax():
    torch.testing.assert_close(probs_of(LOG_P), torch.tensor([0.4, 0.3, 0.2, 0.1]))


def test_temperature_sharpens_and_flattens():
    # p^(1/T) renormalised: T = 0.5 squares the probabilities
    squared = torch.tensor([0.16, 0.09, 0.04, 0.01]) / 0.30
    torch.testing.assert_close(probs_of(LOG_P, temperature=0.5), squared)
    assert probs_of(LOG_P, temperature=100.0).max() < 0.26


def test_greedy_row_is_one_hot_at_the_argmax():
    probs = probs_of([0.5, 3.0, 2.9, -1.0], temperature=0)
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_top_k_keeps_the_k_most_likely():
    torch.testing.assert_close(probs_of(LOG_P, top_k=2), torch.tensor([4 / 7, 3 / 7, 0, 0]))
    torch.testing.assert_close(probs_of(LOG_P, top_k=10), torch.tensor([0.4, 0.3, 0.2, 0.1]))


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    # 0.4 + 0.3 = 0.7 >= 0.6: two tokens; 0.7 < 0.75: a third is needed
    torch.testing.assert_close(probs_of(LOG_P, top_p=0.6), torch.tensor([4 / 7, 3 / 7, 0, 0]))
    torch.testing.assert_close(probs_of(LOG_P, top_p=0.75), torch.tensor([4 / 9, 3 / 9, 2 / 9, 0]))
    torch.testing.assert_close(probs_of(LOG_P, top_p=0.3), torch.tensor([1.0, 0, 0, 0]))


def test_top_p_applies_to_what_top_k_kept():
    # top-k 3 renormalises to 4/9, 3/9, 2/9; then 4/9 + 3/9 = 0.78 >= 0.7
    torch.testing.assert_close(probs_of(LOG_P, top_k=3, top_p=0.7), torch.tensor([4 / 7, 3 / 7, 0, 0]))


def test_each_row_uses_its_own_settings():
    logits = torch.tensor([LOG_P] * 3)
    probs = logits_to_probs(logits, SamplingTensors.build([0.0, 1.0, 1.0], [0, 2, 0], [1.0, 1.0, 0.6]))
    torch.testing.assert_close(probs, torch.tensor([[1.0, 0, 0, 0], [4 / 7, 3 / 7, 0, 0], [4 / 7, 3 / 7, 0, 0]]))


def test_sample_is_reproducible_per_generator_and_greedy_takes_the_argmax():
    probs = torch.tensor([[0.1, 0.2, 0.7], [0.25, 0.25, 0.5]])
    draws = [sample(probs, [True, False], [torch.Generator().manual_seed(3)] * 2) for _ in range(2)]
    assert draws[0] == draws[1] and draws[0][0] == 2


# --- generation ----------------------------------------------------------------------------------------------------

def test_greedy_generation_is_deterministic(llm):
    first = llm.generate(PROMPTS[:3], greedy())
    second = llm.generate(PROMPTS[:3], greedy())
    assert [o.output_token_ids for o in first] == [o.output_token_ids for o in second]
    assert all(len(o.output_token_ids) == 12 for o in first)


def test_stream_pieces_add_up_to_the_final_output(llm):
    engine = llm.engine
    request_id = engine.add_request(PROMPTS[0], greedy(10))
    stream = drain(engine)[request_id]
    assert [o.finished for o in stream] == [False] * (len(stream) - 1) + [True]
    final = stream[-1]
    assert sum((o.new_token_ids for o in stream), []) == final.output_token_ids
    assert "".join(o.new_text for o in stream) == final.text
    assert visible(final.text) == visible(llm.tokenizer.decode(final.output_token_ids))


def test_batch_invariance_with_requests_joining_at_different_steps(llm):
    # 16 requests of mixed prompt and output lengths (a few seeded sampled ones among them);
    # each one's output must not depend on what else is in the batch or when it joined
    prompts = [PROMPTS[i % len(PROMPTS)] * (1 + i // len(PROMPTS)) for i in range(16)]
    params = [SamplingParams(temperature=1.5, max_tokens=10, seed=i) if i % 4 == 3 else greedy(4 + (5 * i) % 13)
              for i in range(16)]
    alone = [llm.generate(prompt, p)[0].output_token_ids for prompt, p in zip(prompts, params)]
    engine = llm.engine
    ids, streams = [], {}
    for joining, steps in ((range(0, 5), 3), (range(5, 9), 1), (range(9, 16), 2)):
        ids += [engine.add_request(prompts[i], params[i]) for i in joining]
        for _ in range(steps):
            for output in engine.step():
                streams.setdefault(output.request_id, []).append(output)
    for request_id, outputs in drain(engine).items():
        streams.setdefault(request_id, []).extend(outputs)
    batched = [streams[request_id][-1].output_token_ids for request_id in ids]
    assert batched == alone


def test_same_seed_same_output_whatever_the_batch(llm):
    seeded = SamplingParams(temperature=2.0, top_k=40, top_p=0.95, max_tokens=16, seed=1234)
    alone = llm.generate(PROMPTS[0], seeded)[0].output_token_ids
    engine = llm.engine
    engine.add_request(PROMPTS[1], SamplingParams(temperature=2.0, max_tokens=20))
    engine.add_request(PROMPTS[2], greedy(3))
    engine.step()
    engine.step()
    request_id = engine.add_request(PROMPTS[0], seeded)
    engine.add_request(PROMPTS[3], SamplingParams(temperature=1.0, max_tokens=8, seed=1234))
    batched = drain(engine)[request_id][-1].output_token_ids
    assert batched == alone
    other_seed = llm.generate(PROMPTS[0], SamplingParams(temperature=2.0, top_k=40, top_p=0.95, max_tokens=16,
                                                         seed=4321))[0].output_token_ids
    assert other_seed != alone, "sampling should depend on the seed"


def test_max_tokens_ends_with_length(llm):
    output = llm.generate(PROMPTS[0], greedy(5, ignore_eos=True))[0]
    assert len(output.output_token_ids) == 5 and output.finish_reason == "length"


def test_the_context_window_ends_with_length(llm):
    prompt = list(range(TINY_ENGINE["max_model_len"] - 3))
    output = llm.generate(prompt, greedy(50, ignore_eos=True))[0]
    assert len(output.output_token_ids) == 3 and output.finish_reason == "length"


def test_a_prompt_one_short_of_the_window_gets_one_token(llm):
    output = llm.generate(list(range(TINY_ENGINE["max_model_len"] - 1)), greedy(50, ignore_eos=True))[0]
    assert len(output.output_token_ids) == 1 and output.finish_reason == "length"


def test_stop_token_id_ends_generation_and_is_not_in_the_text(llm):
    reference = llm.generate(PROMPTS[0], greedy(20))[0].output_token_ids
    stop_token = reference[4]
    index = reference.index(stop_token)
    output = llm.generate(PROMPTS[0], greedy(20, stop_token_ids=[stop_token]))[0]
    assert output.output_token_ids == reference[:index + 1]
    assert output.finish_reason == "stop"
    assert visible(output.text) == visible(llm.tokenizer.decode(reference[:index]))


def test_eos_ends_with_stop_unless_ignored(llm, monkeypatch):
    reference = llm.generate(PROMPTS[4], greedy(20))[0].output_token_ids
    eos = reference[5]
    index = reference.index(eos)
    monkeypatch.setattr(llm.tokenizer, "eos_token_ids", [eos])   # make the model "say" EOS at step index
    stopped = llm.generate(PROMPTS[4], greedy(20))[0]
    assert stopped.output_token_ids == reference[:index + 1] and stopped.finish_reason == "stop"
    assert visible(stopped.text) == visible(llm.tokenizer.decode(reference[:index]))
    ignored = llm.generate(PROMPTS[4], greedy(20, ignore_eos=True))[0]
    assert ignored.output_token_ids == reference and ignored.finish_reason == "length"


def test_stop_string_split_across_steps_is_cut_from_the_text(llm):
    reference = llm.generate(PROMPTS[0], greedy(30))[0]
    stop = first_ascii_pair(reference.text, start=2)      # two byte tokens: completed one step after it starts
    cut = reference.text.index(stop)
    engine = llm.engine
    request_id = engine.add_request(PROMPTS[0], greedy(30, stop=[stop]))
    stream = drain(engine)[request_id]
    final = stream[-1]
    assert final.finish_reason == "stop"
    assert final.text == reference.text[:cut]
    assert "".join(o.new_text for o in stream) == final.text
    assert not any(stop in o.new_text for o in stream)
    assert final.output_token_ids == reference.output_token_ids[:len(final.output_token_ids)]
    assert len(final.output_token_ids) < len(reference.output_token_ids)


def test_text_held_back_for_a_stop_string_that_never_completes_is_released(llm):
    reference = llm.generate(PROMPTS[0], greedy(30))[0]
    pair = first_ascii_pair(reference.text, start=2)
    stop = pair + "\x00"                                   # matches partially, never completely
    engine = llm.engine
    request_id = engine.add_request(PROMPTS[0], greedy(30, stop=[stop]))
    stream = drain(engine)[request_id]
    assert stream[-1].finish_reason == "length"
    assert "".join(o.new_text for o in stream) == stream[-1].text == reference.text


# --- prompts: text, token ids, chat messages -----------------------------------------------------------------------

def test_text_prompt_is_encoded_with_bos(llm):
    output = llm.generate("hi", greedy(3))[0]
    assert output.prompt_token_ids[0] == 256
    assert llm.tokenizer.decode(output.prompt_token_ids) == "hi"


def test_token_id_prompt_matches_the_same_text_prompt(llm):
    as_text, as_ids = llm.generate(["hi there", llm.tokenizer.encode("hi there")], greedy(6))
    assert as_ids.prompt_token_ids == as_text.prompt_token_ids
    assert as_ids.output_token_ids == as_text.output_token_ids


def test_chat_messages_go_through_the_chat_template(llm):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    output = llm.generate(messages, greedy(3))[0]
    rendered = "<s>system: be brief\n<s>user: hi\n<s>assistant: "
    assert output.prompt_token_ids == llm.tokenizer.encode(rendered, add_special_tokens=False)
    assert output.prompt_token_ids[:2] != [256, 256]     # no second BOS in front of the template's own


# --- abort, preemption and leaks -----------------------------------------------------------------------------------

def test_abort_of_running_and_waiting_requests_frees_their_blocks(llm):
    engine = llm.engine
    running = engine.add_request(PROMPTS[0], greedy(30))
    engine.step()
    waiting = engine.add_request(PROMPTS[1], greedy(30))
    survivor = engine.add_request(PROMPTS[2], greedy(5, ignore_eos=True))
    used_before = engine.block_manager.num_used_blocks
    engine.abort(running)
    engine.abort(waiting)
    engine.abort("no-such-request")                        # unknown ids are ignored
    assert engine.block_manager.num_used_blocks < used_before
    streams = drain(engine)
    assert streams[running][-1].finish_reason == streams[waiting][-1].finish_reason == "abort"
    assert streams[running][-1].finished and streams[waiting][-1].finished
    assert streams[survivor][-1].finish_reason == "length"
    engine.abort(survivor)                                 # already finished: nothing happens
    assert not engine.has_unfinished()


def test_nothing_is_kept_for_finished_requests(llm):
    engine = llm.engine
    llm.generate(PROMPTS, [SamplingParams(temperature=1.0, max_tokens=6), greedy(6)] * 3)
    request_id = engine.add_request(PROMPTS[0], SamplingParams(temperature=1.0, max_tokens=30))
    engine.step()
    engine.abort(request_id)
    drain(engine)
    assert engine.requests == {}
    assert engine.outputs.detokenizers == {} and engine.outputs.texts == {}
    assert engine.runner.generators == {}, "per-request generators of finished requests are kept"


@pytest.fixture(scope="module")
def small_cache_llm():
    # 16 blocks of 4 = 64 slots: six 30-token requests need 48 blocks, so some are preempted
    return LLM(checkpoint=tiny_checkpoint(), dtype="float32", num_kv_blocks=16, block_size=4, max_model_len=64,
               max_num_batched_tokens=64)


def test_preempted_requests_are_recomputed_to_the_same_outputs(llm, small_cache_llm):
    params = [greedy(20, ignore_eos=True) if i % 2 else
              SamplingParams(temperature=2.0, max_tokens=20, seed=i, ignore_eos=True) for i in range(6)]
    expected = [o.output_token_ids for o in llm.generate(PROMPTS, params)]
    engine = small_cache_llm.engine
    ids = [engine.add_request(prompt, p) for prompt, p in zip(PROMPTS, params)]
    preemptions = set()

    def check():
        engine.block_manager.check_invariants()
        preemptions.update(seq.num_preemptions for seq in engine.requests.values())

    streams = drain(engine, after_each_step=check)
    assert max(preemptions) > 0, "the small cache should have forced preemption"
    assert [streams[request_id][-1].output_token_ids for request_id in ids] == expected
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.fixture(scope="module")
def cache_smaller_than_window_llm():
    # 4 blocks of 4 = 16 slots, less than max_model_len 64
    return LLM(checkpoint=tiny_checkpoint(), dtype="float32", num_kv_blocks=4, block_size=4, max_model_len=64,
               max_num_batched_tokens=64)


def test_a_request_outgrowing_the_whole_kv_cache_ends_instead_of_hanging(cache_smaller_than_window_llm):
    engine = cache_smaller_than_window_llm.engine
    request_id = engine.add_request(list(range(8)), greedy(40, ignore_eos=True))
    final = drain(engine, max_steps=100)[request_id][-1]
    assert final.finish_reason == "length"
    assert len(final.prompt_token_ids) + len(final.output_token_ids) <= 16
    assert engine.block_manager.num_free_blocks == 4


# --- bad input: one clear line each -------------------------------------------------------------------------------

def one_line(error: Exception) -> str:
    message = str(error)
    assert message and "\n" not in message
    return message


@pytest.mark.parametrize("prompt, fragment", [
    ("", "empty"),
    ([], "empty"),
    (list(range(TINY_ENGINE["max_model_len"])), "context window"),
    ([1, 258], "out of range"),
    ([-1, 5], "out of range"),
    ([1, "a"], "a prompt is"),
])
def test_bad_prompts_are_refused_with_one_clear_line(llm, prompt, fragment):
    with pytest.raises(InputError) as error:
        llm.engine.add_request(prompt, greedy())
    assert fragment in one_line(error.value)


def test_a_prompt_bigger_than_the_kv_cache_is_refused(cache_smaller_than_window_llm):
    with pytest.raises(InputError) as error:
        cache_smaller_than_window_llm.engine.add_request([1] * 20, greedy())
    assert "KV cache" in one_line(error.value)


def test_a_duplicate_request_id_is_refused(llm):
    engine = llm.engine
    engine.add_request("a", greedy(), request_id="same")
    with pytest.raises(InputError) as error:
        engine.add_request("b", greedy(), request_id="same")
    assert "already in flight" in one_line(error.value)
    engine.abort("same")
    drain(engine)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(stop=[""]), "stop"),
])
def test_bad_sampling_params(kwargs, fragment):
    with pytest.raises(ConfigError) as error:
        SamplingParams(**kwargs)
    assert fragment in one_line(error.value)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(dtype="fp8"), "dtype"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(block_size=0), "block_size"),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
    (dict(kv_cache_gb=0), "kv_cache_gb"),
    (dict(num_kv_blocks=0), "num_kv_blocks"),
    (dict(num_speculative_tokens=17), "num_speculative_tokens"),
    (dict(num_threads=0), "num_threads"),
    (dict(decode_threads=0), "decode_threads"),
])
def test_bad_engine_config(kwargs, fragment):
    with pytest.raises(ConfigError) as error:
        EngineConfig(**kwargs)
    assert fragment in one_line(error.value)


def test_the_kv_cache_is_its_budget_but_no_more_than_max_num_seqs_sequences_can_hold():
    """The tiny model keeps a token in 512 bytes (2 layers x keys and values x 2 heads x 16 x fp32): 1 GiB is
    2M tokens, of which 3 sequences of 64 tokens in blocks of 4 can hold 48 blocks; a budget of 8 KiB is 4
    blocks; --num-kv-blocks is taken as given."""
    checkpoint = tiny_checkpoint()
    sizes = dict(dtype="float32", max_num_seqs=3, max_model_len=64, block_size=4)
    for settings, blocks in ((dict(kv_cache_gb=1.0), 48), (dict(kv_cache_gb=8 * 1024 / 2**30), 4),
                             (dict(num_kv_blocks=100), 100)):
        engine = LLM(checkpoint=checkpoint, **sizes, **settings).engine
        assert engine.block_manager.num_blocks == blocks, settings
        assert engine.runner.kv_cache.shape[3] == blocks * 4


def test_decode_steps_run_on_decode_threads_and_larger_steps_on_num_threads():
    previous = torch.get_num_threads()
    try:
        engine = LLM(checkpoint=tiny_checkpoint(), **{**TINY_ENGINE, "num_threads": 2, "decode_threads": 1}).engine
        seen = []
        engine.runner.execute = lambda batch, proposal, run=engine.runner.execute: (
            seen.append((batch.num_tokens, torch.get_num_threads())) or run(batch, proposal))
        engine.add_request(list(range(1, DECODE_STEP_TOKENS + 2)), greedy(max_tokens=3))
        drain(engine)
        assert seen == [(DECODE_STEP_TOKENS + 1, 2), (1, 1), (1, 1)]
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("speculative, fragment", [("magic", "unknown speculative method 'magic'"),
                                                   ("layer_skip:x", "layer_skip:L")])
def test_bad_speculative_method(speculative, fragment):
    with pytest.raises(ConfigError) as error:
        LLM(checkpoint=tiny_checkpoint(), speculative=speculative, **TINY_ENGINE)
    assert fragment in one_line(error.value)


def test_a_long_prompt_joins_running_requests_in_chunks_without_changing_any_output(llm):
    budget = 8
    chunked = LLM(checkpoint=tiny_checkpoint(), dtype="float32", num_kv_blocks=128, block_size=4, max_model_len=96,
                  max_num_batched_tokens=budget).engine
    long_prompt = [(7 * i) % 250 for i in range(60)]
    running = [chunked.add_request(prompt, greedy(30, ignore_eos=True)) for prompt in PROMPTS[:2]]
    for _ in range(3):
        chunked.step()                                   # both running requests decode
    joining = chunked.add_request(long_prompt, greedy(10, ignore_eos=True))
    long_seq = chunked.requests[joining]
    streams = {request_id: [] for request_id in running + [joining]}
    chunks = []
    while chunked.has_unfinished():
        computed_before, prefilling = long_seq.num_computed_tokens, long_seq.num_output_tokens == 0
        advanced = {output.request_id for output in chunked.step()}
        for request_id in streams:
            if request_id in chunked.requests:
                streams[request_id].append(chunked.requests[request_id].output_token_ids)
        if prefilling:
            chunks.append(long_seq.num_computed_tokens - computed_before)
            # every step that prefilled a chunk also decoded both running requests
            assert set(running) <= advanced
    assert sum(chunks) == len(long_prompt) and max(chunks) <= budget - len(running)
    assert len(chunks) >= len(long_prompt) // budget, "the long prompt should have taken several steps"
    expected = llm.generate(PROMPTS[:2] + [long_prompt], [greedy(30, ignore_eos=True)] * 2 +
                            [greedy(10, ignore_eos=True)])
    finals = [streams[request_id][-1] for request_id in running + [joining]]
    assert finals == [output.output_token_ids[:len(final)] for output, final in zip(expected, finals)]
