"""Draft trees (engine/spec_decode/draft_tree.py) and the runner's rows at explicit positions with a mask.

  - the trie of candidates, its depth-first order, depths, the mask and the counted draft length
    on the module's worked example, written out by hand;
  - on a tiny random fp32 model, every row of a tree fed after a sequence's last token gets the
    logits plain decoding computes for the tokens that row sees (its path, or a free row's
    visible rows), so the mask and the positions are right;
  - after a non-first candidate is accepted, the runner's K/V move leaves in the real slots the
    K/V a plain prefill of the accepted text writes there.
"""

import pytest
import torch

from specwise.engine.model_runner import ModelRunner
from specwise.engine.sequence import Sequence
from specwise.engine.spec_decode.draft_tree import DraftTree
from specwise.engine.spec_decode.proposer import Proposal
from specwise.models.checkpoints.loader import build_model
from specwise.sampling_params import SamplingParams
from tiny_models import tiny_checkpoint

BLOCK_SIZE = 4
PROMPT = [256, 72, 101, 108, 108, 111, 44, 32, 119, 111]        # <s>Hello, wo
CANDIDATES = [[114, 108, 100], [114, 101], [33]]


def test_the_worked_example_by_hand():
    tree = DraftTree.from_candidates([[5, 6], [5, 7]])
    assert (tree.token_ids, tree.parents, tree.depths()) == ([5, 6, 7], [-1, 0, 0], [0, 1, 1])
    # len(seq) = 10: columns 0..9 the context, 10..12 the rows (nodes 0, 1, 2)
    expected = torch.tensor([[1] * 10 + [0, 0, 0],
                             [1] * 10 + [1, 0, 0],
                             [1] * 10 + [1, 1, 0],
                             [1] * 10 + [1, 0, 1]], dtype=torch.bool)
    assert torch.equal(tree.attention_mask(10), expected)
    assert tree.drafted([0, 2]) == 2 and tree.drafted([]) == 2


def test_tries_merge_prefixes_in_depth_first_order_and_count_the_followed_candidate():
    tree = DraftTree.from_candidates(CANDIDATES)
    assert tree.token_ids == [114, 108, 100, 101, 33]
    assert tree.parents == [-1, 0, 1, 0, -1]
    assert [tree.path_tokens(node) for node in range(5)] == [[114], [114, 108], [114, 108, 100], [114, 101], [33]]
    assert tree.drafted([0]) == 3          # [114] continues as the 3-token candidate
    assert tree.drafted([0, 3]) == 2       # [114, 101]: the 2-token candidate
    assert tree.drafted([4]) == 1
    tree.prune([True, False, True, True, True])     # node 1 goes, and node 2 below it
    assert (tree.token_ids, tree.parents) == ([114, 101, 33], [-1, 0, -1])


def test_free_rows_see_what_they_list_and_bad_trees_are_refused():
    tree = DraftTree.from_candidates([[5]]).with_free_rows([8, 9], [0, 1], [[], [0]])
    assert torch.equal(tree.visibility(), torch.tensor([[1, 0, 0], [0, 1, 0], [0, 1, 1]], dtype=torch.bool))
    assert tree.position_offsets() == [0, 0, 1]
    with pytest.raises(ValueError, match="parent"):
        DraftTree([1, 2], [1, -1])
    with pytest.raises(ValueError, match="sibling"):
        DraftTree([1, 1], [-1, -1])
    with pytest.raises(ValueError, match="both"):
        Proposal([[3]], trees=[tree])


@pytest.fixture(scope="module")
def runner():
    checkpoint = tiny_checkpoint()
    model = build_model(checkpoint, torch.float32, "cpu", 128)
    return ModelRunner(model, num_blocks=64, block_size=BLOCK_SIZE, dtype=torch.float32)


def plain_last_logits(runner: ModelRunner, token_ids: list[int]) -> torch.Tensor:
    """Logits after token_ids, from a fresh prefill in blocks 40.. (away from the tree's)."""
    table = list(range(40, 40 + -(-len(token_ids) // BLOCK_SIZE)))
    return runner.forward([token_ids], [0], [table], [1])[0]


def tree_step(runner: ModelRunner, tree: DraftTree) -> tuple[torch.Tensor, list[int]]:
    """Prefill PROMPT[:-1], then feed the last token and the tree's rows; logits [1 + rows, vocab]."""
    table = list(range(0, 10))
    runner.forward([PROMPT[:-1]], [0], [table], [0])
    logits = runner.forward([[PROMPT[-1]] + tree.token_ids], [len(PROMPT) - 1], [table],
                            [1 + tree.num_rows], trees=[tree])
    return logits, table


def test_every_row_gets_the_logits_of_the_text_it_sees(runner):
    # free rows as a small Jacobi window: row 0 at offset 0; row 1 at offset 1 sees row 0; row 2 at
    # offset 1 sees row 0 too (a second guess for the same position)
    tree = DraftTree.from_candidates(CANDIDATES).with_free_rows([65, 66, 67], [0, 1, 1], [[], [0], [0]])
    logits, _ = tree_step(runner, tree)
    seen = [[]] + [tree.path_tokens(node) for node in range(tree.num_nodes)] + [[65], [65, 66], [65, 67]]
    for row, extra in enumerate(seen):
        torch.testing.assert_close(logits[row], plain_last_logits(runner, PROMPT + extra), atol=1e-4, rtol=1e-4)


def test_the_accepted_candidates_kv_moves_to_its_positions(runner):
    tree = DraftTree.from_candidates(CANDIDATES)
    _, table = tree_step(runner, tree)
    seq = Sequence("r", PROMPT, SamplingParams())
    seq.block_table = table
    tree.accepted = [0, 3]                  # [114, 101]: node 3 sits in the slot of position len + 3
    runner._move_accepted_kv([seq], [tree])
    reference_table = list(range(40, 44))
    runner.forward([PROMPT + [114, 101]], [0], [reference_table], [1])
    for position in (len(PROMPT), len(PROMPT) + 1):
        real = runner.kv_cache[:, :, :, runner.slot(seq, position)]
        reference = runner.kv_cache[:, :, :, reference_table[position // BLOCK_SIZE] * BLOCK_SIZE
                                    + position % BLOCK_SIZE]
        torch.testing.assert_close(real, reference, atol=1e-5, rtol=1e-5)
