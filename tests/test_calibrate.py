"""`specwise calibrate`: a step profile the simulator, the calculators and the adaptive policy read."""

import json

import pytest

from specwise.engine.cost.step_profile import ProfileCost
from specwise.engine_cli import timed_prefill_sample
from specwise.cli import build_parser, main
from specwise.cli_args import dataclass_from_args
from specwise.engine.cost.step_fit import FitOptions
from tiny_checkpoints import make_tiny_hf_config, random_state_dict, write_hf_checkpoint

ENGINE = ["--num-kv-blocks", "64", "--max-model-len", "64", "--max-num-batched-tokens", "256"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    hf_config = make_tiny_hf_config()
    return str(write_hf_checkpoint(tmp_path_factory.mktemp("tiny"), hf_config, random_state_dict(hf_config)))


def test_calibrate_writes_a_profile_with_its_grid_and_prefill_axis(tmp_path, model_dir, capsys):
    path = tmp_path / "profile.json"
    assert main(["calibrate", "--model", model_dir, *ENGINE, "--batch-sizes", "1,4", "--tokens-per-seq", "1,3",
                 "--context-lens", "0,16", "--prefill-tokens", "16,40,41,128", "--prefill-prompt-len", "32",
                 "--repeats", "1", "--output", str(path)]) == 0
    data = json.loads(path.read_text())
    assert (data["batch_sizes"], data["tokens_per_seq"], data["context_lens"]) == ([1, 4], [1, 3], [0, 16])
    assert len(data["seconds"]) == 2 and all(len(row) == 2 and len(row[0]) == 2 for row in data["seconds"])
    # 16 -> one prompt of 16; 40 -> one of 40; 41 rounds to one of 41; 128 -> four of 32
    assert data["prefill_tokens"] == [16, 40, 41, 128] and data["prefill_prompt_len"] == 32
    assert all(seconds > 0 for seconds in data["prefill_seconds"])
    assert data["prefill_pads_to_longest"] is False          # flat steps: no padding to the longest prompt
    profile = ProfileCost.load(path)
    assert profile.prefill_time([64, 64]) == pytest.approx(data["prefill_seconds"][-1])
    out = capsys.readouterr().out
    assert "wrote" in out
    # the linear fit of the same steps (engine/cost/step_fit.py), with its residuals printed
    assert {"fixed_s", "per_token_s", "per_kv_token_s", "median_residual", "worst_residual"} <= set(data["linear"])
    assert "fitted linear:" in out and "residuals over 12 steps" in out
    assert "per_attention_pair_s" not in data["linear"]           # counted, fitted only when asked


def test_calibrate_fits_attention_pairs_only_when_asked():
    """--fit-attention-pairs, one flag for our engine's calibrate and --endpoint's alike (FitOptions)."""
    asked = build_parser().parse_args(["calibrate", "--fit-attention-pairs"])
    assert dataclass_from_args(FitOptions, asked) == FitOptions(fit_attention_pairs=True)
    assert dataclass_from_args(FitOptions, build_parser().parse_args(["calibrate"])) == FitOptions()


def test_calibrate_rejects_a_grid_past_the_context_window(tmp_path, model_dir, capsys):
    assert main(["calibrate", "--model", model_dir, *ENGINE, "--context-lens", "0,100",
                 "--output", str(tmp_path / "p.json")]) == 2
    assert "context window" in capsys.readouterr().err
    assert main(["calibrate", "--model", model_dir, *ENGINE, "--context-lens", "0,16", "--prefill-prompt-len", "65",
                 "--output", str(tmp_path / "p.json")]) == 2
    assert "--prefill-prompt-len" in capsys.readouterr().err


def test_a_timed_prefill_step_counts_its_prompts():
    """measure_prefill's step of 128 tokens at --prefill-prompt-len 32 is four prompts of 32 over no
    cache: 4 logits rows and 4 x 32 x 33 / 2 = 2,112 attention pairs, as the simulator counts them."""
    sample = timed_prefill_sample(128, 0.5, 32)
    assert (sample.tokens, sample.kv_tokens, sample.pairs, sample.rows) == (128, 0, 2112, 4)
    assert timed_prefill_sample(41, 0.1, 32).pairs == 41 * 42 / 2                  # one prompt of 41
