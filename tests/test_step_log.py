"""The step log (engine/step_log.py): every step the engine runs, one JSON line with what it computed and
how long it took, in memory for GET /steps and in a file with `--step-log FILE`."""

import json

from specwise.config import EngineConfig
from specwise.engine.llm_engine import LLMEngine
from specwise.engine.step_log import StepLog
from specwise.sampling_params import SamplingParams
from tiny_models import tiny_checkpoint


def test_every_step_is_logged_with_its_shape(tmp_path):
    """Prompts of 5 and 30 tokens at a budget of 16, 4 tokens each, no speculation: the first step prefills
    the 5 and 11 of the 30 (sampling the 5's last row), the second decodes the 5 beside 15 more of the 30,
    the third beside its last 4 (sampling both), and decodes follow until the 30's last."""
    path = tmp_path / "steps.jsonl"
    config = EngineConfig(dtype="float32", max_model_len=128, num_kv_blocks=32, max_num_batched_tokens=16,
                          step_log=str(path))
    engine = LLMEngine(config, tiny_checkpoint())
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    engine.add_prepared(list(range(1, 6)), params, "short")
    engine.add_prepared(list(range(1, 31)), params, "long")
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == steps
    assert all(line["seconds"] > 0 for line in lines)
    assert [line["start"] for line in lines] == sorted(line["start"] for line in lines)
    first, second, third = lines[:3]
    assert (first["fed"], first["cached"], first["sampled"], first["prompt_tokens"]) == ([5, 11], [0, 0], 1, 16)
    assert (second["fed"], second["cached"], second["sampled"], second["prompt_tokens"]) == ([1, 15], [5, 11], 1, 15)
    assert (third["fed"], third["cached"], third["sampled"], third["prompt_tokens"]) == ([1, 4], [6, 26], 2, 4)
    assert lines[-1]["fed"] == [1] and lines[-1]["prompt_tokens"] == 0
    assert sum(sum(line["fed"]) for line in lines) == 5 + 30 + 2 * 3     # every prompt token and decode row once


def test_a_drafting_step_logs_the_drafts_fed_not_the_room(tmp_path):
    """n-gram drafting with k = 4 over a prompt that repeats itself in part: the scheduler makes room for 4
    drafts every decode step, the drafter fills it only where the last tokens recur. Each decode line's row
    count is 1 + the drafts proposed, so the logged draft rows sum to the engine's own count of draft
    tokens, and some step was fed fewer than its room (the line would say 5 rows if it logged the room)."""
    path = tmp_path / "steps.jsonl"
    config = EngineConfig(dtype="float32", max_model_len=128, num_kv_blocks=32, speculative="ngram",
                          num_speculative_tokens=4, step_log=str(path))
    engine = LLMEngine(config, tiny_checkpoint())
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    engine.add_prepared([3, 9, 4, 7, 3, 9, 4, 7, 3, 9, 4, 7, 3, 9, 4] + list(range(20, 40)), params, "repeats")
    while engine.has_unfinished():
        engine.step()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    decodes = [line for line in lines if line["prompt_tokens"] == 0]
    draft_rows = [line["fed"][0] - 1 for line in decodes]
    assert sum(draft_rows) == engine.stats.draft_tokens
    assert all(line["sampled"] == line["fed"][0] for line in decodes)
    assert 0 in draft_rows                        # a step whose drafter found nothing: 1 row, not the room's 5
    assert engine.stats.draft_tokens > 0          # and some that drafted


def test_the_last_steps_are_kept_in_memory_and_numbered(tmp_path):
    """What GET /steps answers: the engine's lines numbered from 0, the last `keep` of them in memory (here 3);
    `since(n)` gives those numbered n on, at most `limit`, with the next line's number; older ones are gone."""
    path = tmp_path / "steps.jsonl"
    config = EngineConfig(dtype="float32", max_model_len=128, num_kv_blocks=32, max_num_batched_tokens=16)
    engine = LLMEngine(config, tiny_checkpoint())
    engine.step_log = StepLog(str(path), keep=3)
    engine.add_prepared(list(range(1, 31)), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), "long")
    while engine.has_unfinished():
        engine.step()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    count = len(lines)
    assert count == 2 + 3          # two prompt chunks of 16 and 14 (the second samples), three decodes
    assert engine.step_log.since(0) == (lines[-3:], count)
    assert engine.step_log.since(count - 2) == (lines[-2:], count)
    assert engine.step_log.since(count - 3, limit=1) == (lines[-3:-2], count)
    assert engine.step_log.since(count, limit=0) == ([], count)
