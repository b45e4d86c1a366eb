"""Each response's own speculative counters read into Acceptance: ours, vLLM 0.32's, SGLang 0.5.23's
(shapes as those versions send them)."""

from specwise.bench.load.targets.base import Acceptance
from specwise.bench.load.targets.per_request import per_request_acceptance

SGLANG_DETAILS = {"spec_accept_rate": 0.5, "spec_accept_length": 3.0, "spec_cap_length": 0.0,
                  "spec_block_accept_length": 0.0, "spec_num_correct_drafts": 11, "spec_num_proposed_drafts": 24,
                  "spec_verify_ct": 6, "spec_correct_drafts_histogram": [1, 1, 1, 1, 2], "spec_cap_lens_histogram": []}


def test_sglang_spec_tokens_details_chunk():
    chunk = {"id": "x", "object": "text_completion", "choices": [], "sglext": {"spec_tokens_details": SGLANG_DETAILS}}
    # accepted at position i: steps that accepted more than i drafts: [5, 4, 3, 2]
    assert per_request_acceptance(chunk) == Acceptance(6, 24, 11, [5, 4, 3, 2])
    listed = {"sglext": {"spec_tokens_details": [SGLANG_DETAILS, dict(SGLANG_DETAILS, spec_verify_ct=1)]}}
    assert per_request_acceptance(listed).drafts == 6              # n > 1: the first choice's


def test_sglang_chunks_without_details_carry_no_acceptance():
    assert per_request_acceptance({"sglext": {"routed_experts": None, "spec_tokens_details": None}}) is None
    assert per_request_acceptance({"sglext": {"spec_tokens_details": dict(SGLANG_DETAILS, spec_verify_ct=0)}}) is None
    assert per_request_acceptance({"choices": [{"index": 0, "text": "a"}]}) is None


def test_vllm_and_our_own_fields():
    vllm = {"choices": [], "usage": {}, "metrics": {"speculative_decoding": {
        "num_spec_steps": 6, "num_draft_tokens": 24, "num_accepted_draft_tokens": 11,
        "acceptance_histogram": [1, 1, 1, 1, 2]}}}
    assert per_request_acceptance(vllm) == Acceptance(6, 24, 11, [5, 4, 3, 2])
    ours = {"specwise": {"speculative": True, "drafts": 2, "draft_tokens": 8, "accepted_tokens": 3,
                         "accepted_per_position": [2, 1]}}
    assert per_request_acceptance(ours) == Acceptance(2, 8, 3, [2, 1])
