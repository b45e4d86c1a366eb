"""One k-by-batch-size table (KTable) and one largest k, for the engine, the calculators and the report."""

import subprocess
import sys

import pytest

from specwise.bench.load.arms import parse_methods
from specwise.calc.arms import parse_arm
from specwise.calc.deployment import Deployment, DeploymentConfig
from specwise.calc.roofline import RooflineCost
from specwise.config import EngineConfig
from specwise.engine.spec_decode.config import MAX_SPECULATIVE_TOKENS, SpeculativeConfig
from specwise.engine.spec_decode.k_table import KTable
from specwise.engine.spec_decode.policy import TablePolicy
from specwise.errors import ConfigError


def test_k_for_follows_batch_thresholds():
    table = KTable.parse("1=4/16=2/64=0")
    assert [table.k_for(b) for b in (1, 15, 16, 63, 64, 1000)] == [4, 4, 2, 2, 0, 0]
    assert table.max_k == 4 and not table.is_fixed and table.to_text() == "1=4/16=2/64=0"
    assert KTable.fixed(3).is_fixed and KTable.fixed(3).to_text() == "1=3"


@pytest.mark.parametrize("text, message", [
    ("4=2", "start at 1 and increase"), ("1=2/1=3", "start at 1 and increase"), ("1=x", "BATCH=K pairs"),
    ("1=2=3", "BATCH=K pairs"), ("1=99", f"k must be in 0..{MAX_SPECULATIVE_TOKENS}"),
    ("1-4/16-2", "BATCH=K pairs"), ("1=4,8=2", "BATCH=K pairs"), ("", "BATCH=K pairs")])
def test_bad_tables_say_the_form(text, message):
    with pytest.raises(ConfigError, match=message):
        KTable.parse(text)


def test_vllm_ranges():
    table = KTable.parse("1=4/8=2/32=0")
    assert table.to_vllm_ranges(64) == [[1, 7, 4], [8, 31, 2], [32, 64, 0]]
    assert table.to_vllm_ranges(16) == [[1, 7, 4], [8, 31, 2], [32, 32, 0]]     # the last range is never empty
    assert KTable.fixed(3).to_vllm_ranges(8) == [[1, 8, 3]]


def test_engine_policy_and_arms_read_the_same_text():
    deployment = Deployment.from_config(DeploymentConfig(model="llama-3.1-8b", gpu="h100-sxm"))
    text = "1=5/3=2/5=0"
    policy = TablePolicy.parse(text, max_k=5)
    arm = parse_arm(f"ngram:policy={text},alpha=0.7", RooflineCost(deployment), deployment)
    assert [policy.choose_k(b, 0) for b in range(1, 8)] == [arm.k_for(b) for b in range(1, 8)] == [5, 5, 2, 2, 0, 0, 0]
    assert arm.describe()["k_policy"] == text
    with pytest.raises(ConfigError, match="above --num-speculative-tokens 4"):
        TablePolicy.parse(text, max_k=4)


def test_one_largest_k_everywhere():
    top, over = MAX_SPECULATIVE_TOKENS, MAX_SPECULATIVE_TOKENS + 1
    assert KTable.fixed(top).max_k == top and SpeculativeConfig.parse("ngram", top).num_speculative_tokens == top
    assert EngineConfig(num_speculative_tokens=top).num_speculative_tokens == top
    assert parse_methods(f"off,ngram@{top}", 4)[1].k == top
    for build in (lambda: KTable.fixed(over), lambda: SpeculativeConfig.parse("ngram", over),
                  lambda: EngineConfig(num_speculative_tokens=over), lambda: parse_methods(f"ngram@{over}", 4)):
        with pytest.raises(ConfigError, match=f"\\.\\.{top}"):
            build()


def test_the_table_and_the_k_bound_load_without_torch():
    code = ("import sys; import specwise.engine.spec_decode.k_table, specwise.config, specwise.calc.arms; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
