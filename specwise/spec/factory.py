"""Build the proposer a `--speculative` text names; the engine sees only the protocol."""

from typing import TYPE_CHECKING

from specwise.spec.config import SpeculativeConfig
from specwise.spec.proposer import Proposer

if TYPE_CHECKING:
    from specwise.engine.llm_engine import LLMEngine


def build_proposer(speculative: str | None, num_speculative_tokens: int, engine: "LLMEngine") -> Proposer | None:
    config = SpeculativeConfig.parse(speculative, num_speculative_tokens)
    if config is None:
        return None
    config.check_num_layers(engine.model_config.num_hidden_layers)
    if config.method == "ngram":
        from specwise.spec.ngram import NgramProposer
        return NgramProposer(config.ngram_min_n, config.ngram_max_n)
    if config.method == "layer_skip":
        from specwise.spec.layer_skip import LayerSkipProposer
        return LayerSkipProposer(engine, config.layer_skip_layers)
    from specwise.spec.draft_model import DraftModelProposer
    return DraftModelProposer(engine, config.draft_model)
