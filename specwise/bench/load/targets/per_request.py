"""Each response's own speculative counters, as the engines return them, read into Acceptance.

  specwise (our server): the last chunk's `"specwise": {"speculative": true, "drafts": ..., "draft_tokens": ...,
      "accepted_tokens": ..., "accepted_per_position": [...]}`.
  vLLM 0.32 (`--per-request-spec-decode-metrics summary`): the usage chunk's
      `"metrics": {"speculative_decoding": {"num_spec_steps": drafts, "num_draft_tokens": ...,
      "num_accepted_draft_tokens": ..., "acceptance_histogram": [steps that accepted j drafts]}}`.
  SGLang (read in 0.5.23's srt/entrypoints/openai/protocol.py and serving_*.py): asked per request
      with `"return_spec_tokens_details": true`, a response-level chunk (no choices) carries
      `"sglext": {"spec_tokens_details": {"spec_verify_ct": verification steps, "spec_num_proposed_drafts":
      draft tokens, "spec_num_correct_drafts": accepted, "spec_correct_drafts_histogram": [steps that
      accepted j drafts], ...}}` (a list of them for n > 1: the first choice's is read).
A histogram gives accepted per position: steps that accepted more than i, e.g. [1, 2, 3] -> [5, 3].
"""

from specwise.bench.load.targets.base import Acceptance

SGLANG_REQUEST = {"return_spec_tokens_details": True}     # what SGLang needs in the request body


def per_request_acceptance(payload: dict) -> Acceptance | None:
    """The counters one streamed chunk carries, whichever engine sent it; None when it has none."""
    counters = payload.get("specwise")
    if isinstance(counters, dict) and counters.get("speculative"):
        return Acceptance(counters["drafts"], counters["draft_tokens"], counters["accepted_tokens"],
                          list(counters.get("accepted_per_position") or []))
    return vllm_acceptance(payload.get("metrics")) or sglang_acceptance(payload.get("sglext"))


def vllm_acceptance(metrics) -> Acceptance | None:
    """vLLM's per-request `metrics.speculative_decoding` as Acceptance; None when absent."""
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(spec, dict):
        return None
    try:
        return Acceptance(int(spec["num_spec_steps"]), int(spec["num_draft_tokens"]),
                          int(spec["num_accepted_draft_tokens"]), _per_position(spec.get("acceptance_histogram")))
    except (KeyError, TypeError, ValueError):
        return None


def sglang_acceptance(sglext) -> Acceptance | None:
    """SGLang's per-request `sglext.spec_tokens_details` as Acceptance; None when absent or empty."""
    details = sglext.get("spec_tokens_details") if isinstance(sglext, dict) else None
    if isinstance(details, list):
        details = details[0] if details else None
    if not isinstance(details, dict) or not details.get("spec_verify_ct"):
        return None
    try:
        return Acceptance(int(details["spec_verify_ct"]), int(details["spec_num_proposed_drafts"]),
                          int(details["spec_num_correct_drafts"]),
                          _per_position(details.get("spec_correct_drafts_histogram")))
    except (KeyError, TypeError, ValueError):
        return None


def _per_position(histogram) -> list[int]:
    counts = [int(count) for count in histogram or []]
    return [sum(counts[position + 1:]) for position in range(max(len(counts) - 1, 0))]
