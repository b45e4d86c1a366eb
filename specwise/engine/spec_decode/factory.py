"""Build the proposer a `--speculative` text names; the engine sees only the protocol."""

from typing import TYPE_CHECKING

from specwise.engine.spec_decode.config import SpeculativeConfig
from specwise.engine.spec_decode.proposer import Proposer

if TYPE_CHECKING:
    from specwise.engine.llm_engine import LLMEngine


def build_proposer(speculative: str | None, num_speculative_tokens: int, engine: "LLMEngine") -> Proposer | None:
    config = SpeculativeConfig.parse(speculative, num_speculative_tokens)
    if config is None:
        return None
    config.check_num_layers(engine.model_config.num_hidden_layers)
    if config.method == "ngram":
        from specwise.engine.spec_decode.ngram import NgramProposer
        return NgramProposer(config.ngram_min_n, config.ngram_max_n)
    if config.method == "layer_skip":
        from specwise.engine.spec_decode.layer_skip import LayerSkipProposer
        return LayerSkipProposer(engine, config.layer_skip_layers)
    from specwise.engine.spec_decode.draft_model import DraftModelProposer
    return DraftModelProposer(engine, config.draft_model)


def build_policy(engine: "LLMEngine"):
    """The k-per-step policy named by `--speculative-policy` (static / table:... / auto)."""
    from specwise.engine.spec_decode.policy import AutoPolicy, StaticPolicy, TablePolicy
    text, max_k = engine.config.speculative_policy, engine.num_speculative_tokens
    if text == "static" or engine.proposer is None:
        return StaticPolicy(max_k)
    if text.startswith("table:"):
        return TablePolicy.parse(text.removeprefix("table:"), max_k)
    return AutoPolicy(max_k, step_cost_model(engine, max_k))


def step_cost_model(engine: "LLMEngine", max_k: int):
    """(batch, tokens_per_seq, context) -> seconds, from --step-profile or a quick start-up measurement."""
    from specwise.engine.step_profile import ProfileCost
    if engine.config.step_profile:
        profile = ProfileCost.load(engine.config.step_profile)
    else:
        from specwise.engine.profiler import measure_grid
        batch_sizes = sorted({min(2 ** power, engine.config.max_num_seqs) for power in range(8)})
        tokens = sorted({1, 2, 1 + max_k // 2, 1 + max_k})
        contexts = [16, min(512, engine.max_model_len - 1 - max_k)]
        profile = ProfileCost(batch_sizes, tokens, contexts, measure_grid(engine.runner, batch_sizes, tokens,
                                                                          contexts, repeats=1))
    return lambda batch_size, tokens_per_seq, context: profile.step_time(batch_size, tokens_per_seq, context)
