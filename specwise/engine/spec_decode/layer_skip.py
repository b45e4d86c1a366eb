"""Self-speculative drafting: the target's own first L layers, final norm and LM head.

Training-free and weight-free: the drafter is the target model run with
`num_layers=L`, writing the first L layers' K/V into the target's own cache. The
target recomputes those positions when it verifies, so nothing is ever out of step,
and the drafter's K/V is valid wherever the target's is (num_computed_tokens).
"""

from specwise.engine.spec_decode.context import ProposerContext
from specwise.engine.spec_decode.model_drafter import ModelDrafter
from specwise.engine.spec_decode.proposer import Proposal


class LayerSkipProposer:
    def __init__(self, context: ProposerContext, num_layers: int):
        self.drafter = ModelDrafter(context.runner, num_layers=num_layers)
        context.runner.warm_up(num_layers)     # under --compile: the shorter forward's graphs, before any request

    def propose(self, seqs, num_draft_tokens: list[int]) -> Proposal:
        return self.drafter.draft(seqs, num_draft_tokens, [seq.num_computed_tokens for seq in seqs])

    def free(self, seq) -> None:
        self.drafter.free(seq)
