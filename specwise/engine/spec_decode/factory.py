"""Build the proposer a SpeculativeConfig names, and the k-per-step policy; the engine sees only
the protocols."""

from specwise.config import EngineConfig
from specwise.engine.cost.step_profile import ProfileCost
from specwise.engine.model_runner import ModelRunner
from specwise.engine.profiler import measure_grid
from specwise.engine.spec_decode.config import SpeculativeConfig
from specwise.engine.spec_decode.context import ProposerContext
from specwise.engine.spec_decode.draft_model import DraftModelProposer
from specwise.engine.spec_decode.eagle import EagleProposer
from specwise.engine.spec_decode.layer_skip import LayerSkipProposer
from specwise.engine.spec_decode.lookahead import LookaheadProposer
from specwise.engine.spec_decode.medusa import MedusaProposer
from specwise.engine.spec_decode.ngram import NgramProposer
from specwise.engine.spec_decode.policy import AutoPolicy, StaticPolicy, StepCost, TablePolicy
from specwise.engine.spec_decode.proposer import Proposer
from specwise.engine.spec_decode.suffix import SuffixProposer


def build_proposer(config: SpeculativeConfig | None, context: ProposerContext) -> Proposer | None:
    if config is None:
        return None
    config.check_num_layers(context.num_layers)
    if config.method == "ngram":
        return NgramProposer(config.ngram_min_n, config.ngram_max_n)
    if config.method == "suffix":
        return SuffixProposer(config.suffix_max_depth, config.suffix_cache_tokens)
    if config.method == "lookahead":
        return LookaheadProposer(config.lookahead_window, config.lookahead_ngram, config.lookahead_candidates,
                                 config.num_speculative_tokens)
    if config.method == "layer_skip":
        return LayerSkipProposer(context, config.layer_skip_layers)
    if config.method in ("eagle", "eagle3"):
        return EagleProposer(context, config.head_dir, config.method)
    if config.method == "medusa":
        return MedusaProposer(context, config.head_dir, config.num_speculative_tokens)
    return DraftModelProposer(context, config.draft_model)


def build_policy(config: EngineConfig, max_k: int, runner: ModelRunner, max_model_len: int,
                 proposer: Proposer | None = None):
    """The k-per-step policy named by `--speculative-policy` (static / table:... / auto);
    static when nothing drafts (max_k = 0). A proposer whose k counts rows names auto's levels."""
    text = config.speculative_policy
    if text == "static" or max_k == 0:
        return StaticPolicy(max_k)
    if text.startswith("table:"):
        return TablePolicy.parse(text.removeprefix("table:"), max_k)
    levels = proposer.auto_levels(max_k) if hasattr(proposer, "auto_levels") else None
    return AutoPolicy(max_k, step_cost_model(config, max_k, runner, max_model_len), levels=levels)


def step_cost_model(config: EngineConfig, max_k: int, runner: ModelRunner, max_model_len: int) -> StepCost:
    """(batch, tokens_per_seq, context) -> seconds, from --step-profile or a quick start-up measurement."""
    if config.step_profile:
        profile = ProfileCost.load(config.step_profile)
    else:
        batch_sizes = sorted({min(2 ** power, config.max_num_seqs) for power in range(8)})
        tokens = sorted({1, 2, 1 + max_k // 2, 1 + max_k})
        contexts = [16, min(512, max_model_len - 1 - max_k)]
        profile = ProfileCost(batch_sizes, tokens, contexts, measure_grid(runner, batch_sizes, tokens,
                                                                          contexts, repeats=1))
    return profile.step_time
