"""Ready-to-paste serving configuration for a drafter that paid in the evaluation.

vLLM: `--speculative-config` JSON (method ngram / draft_model, num_speculative_tokens; for n-gram
prompt_lookup_min/max = our n-gram sizes). The dynamic variant adds
`num_speculative_tokens_per_batch_size`, a list of [lo, hi, k] batch-size ranges
(KTable.to_vllm_ranges; k = 0 turns speculation off in that range); it needs a vLLM release
with dynamic speculative decoding.
Suffix decoding: vLLM `{"method": "suffix", "num_speculative_tokens": k,
"suffix_decoding_max_tree_depth": D}` (vLLM bounds its global cache in requests,
`suffix_decoding_max_cached_requests`, not tokens: left at its default, 0 where ours was off);
SGLang `--speculative-algorithm SUFFIX --speculative-num-draft-tokens k+1`.
Lookahead decoding: vLLM and SGLang have none; TensorRT-LLM's LLM API takes
`speculative_config=LookaheadDecodingConfig(max_window_size=W, max_ngram_size=N,
max_verification_set_size=G)` (our W, N, G), also given to trtllm-serve as
`speculative_config: {decoding_type: Lookahead, ...}` in --extra_llm_api_options.
SGLang: `--speculative-algorithm NGRAM | STANDALONE` with a chain of k drafts:
`--speculative-num-steps k --speculative-eagle-topk 1 --speculative-num-draft-tokens k+1`
(the draft-token count includes the verified root token).
Our eagle:DIR / medusa:DIR heads: vLLM's method eagle / medusa with "model" at DIR/export-vllm, which
`specwise export-drafter DIR --format vllm` (or train-drafter --export vllm) writes; the note gives the
command. SGLang cannot hold our EAGLE head (no final norm in its EAGLE models) and has no Medusa: a note
says so (models/export_formats.py).
"""

import json

from specwise.engine.spec_decode.config import SpeculativeConfig
from specwise.engine.spec_decode.k_table import KTable
from specwise.models.export_formats import SGLANG_REFUSALS, VLLM_METHODS, export_command, export_dir

_VLLM_METHODS = {"draft": "draft_model"}
_SGLANG_ALGORITHMS = {"draft": "STANDALONE"}
HEADS = ("eagle", "medusa")         # our heads: served from an exported directory
_EXPORT_FIRST = ("export the head's directory first: specwise export-drafter DIR --format vllm --out OUT, then "
                 "{{\"method\": \"{}\", \"model\": OUT}} (the built-in head's DIR is "
                 "specwise/models/heads/<target>/{})")
NO_SERVER_EQUIVALENT = {"layer_skip": "vLLM and SGLang have no layer-skip (self-speculative) drafter; "
                                      "the closest there is a small draft model or EAGLE heads.",
                        "eagle": _EXPORT_FIRST.format("eagle", "eagle"),
                        "medusa": _EXPORT_FIRST.format("medusa", "medusa"),
                        "lookahead": "vLLM and SGLang have no lookahead decoding; TensorRT-LLM has it "
                                     "(config below); the closest in vLLM/SGLang is ngram (prompt lookup)."}


def batch_size_table(arms, max_batch: int) -> list[list[int]]:
    """[(k, verdict)] for one drafter at several k -> [[lo, hi, k], ...] over batch sizes.

    At each measured concurrency the k of the paying arm with the best speedup wins,
    k = 0 where none pays; a point's range runs up to the next measured concurrency.
    Empty when no arm pays anywhere or k is unknown. Concurrency stands in for batch
    size (a batch never holds more sequences than there are requests in flight).
    """
    arms = [(k, verdict) for k, verdict in arms if k]
    loads = sorted({load for _, verdict in arms for load in verdict.speedup})
    chosen = []
    for load in loads:
        paying = [(verdict.speedup[load], k) for k, verdict in arms if load in verdict.pays_at]
        chosen.append(max(paying)[1] if paying else 0)
    if not any(chosen):
        return []
    steps = [(1 if index == 0 else int(load), k) for index, (load, k) in enumerate(zip(loads, chosen))
             if index == 0 or k != chosen[index - 1]]
    return KTable(tuple(steps)).to_vllm_ranges(max(max_batch, int(loads[-1])))


def vllm_config(spec: str, method: str, k: int, table: list[list[int]]) -> dict:
    base = _vllm_base(spec, method, k)
    if base is None:
        return {"vllm": None, "vllm_dynamic": None,
                "vllm_note": NO_SERVER_EQUIVALENT.get(method, f"no vLLM equivalent known for {spec}")}
    dynamic = None
    if table and len({row[2] for row in table}) > 1:
        dynamic = dict(base, num_speculative_tokens=max(row[2] for row in table),
                       num_speculative_tokens_per_batch_size=table)
    notes = []
    if method in HEADS:
        notes.append(f"Export the head first: {export_command(spec.partition(':')[2], 'vllm')}.")
    if dynamic is not None:
        notes.append("The batch-size table needs a vLLM release with dynamic speculative decoding; "
                     "older releases reject the key: use the fixed config there.")
    return {"vllm": base, "vllm_dynamic": dynamic,
            "vllm_args": f"--speculative-config '{json.dumps(base)}'",
            "vllm_dynamic_args": f"--speculative-config '{json.dumps(dynamic)}'" if dynamic else None,
            "vllm_note": " ".join(notes)}


def sglang_flags(spec: str, method: str, k: int) -> dict:
    argument = spec.partition(":")[2]
    if method in ("ngram", "suffix"):
        return {"sglang": f"--speculative-algorithm {method.upper()} --speculative-num-draft-tokens {k + 1}",
                "sglang_note": ""}
    if method in _SGLANG_ALGORITHMS and argument:
        return {"sglang": (f"--speculative-algorithm {_SGLANG_ALGORITHMS[method]} "
                           f"--speculative-draft-model-path {argument} --speculative-num-steps {k} "
                           f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}"),
                "sglang_note": ""}
    if method in SGLANG_REFUSALS:
        return {"sglang": None, "sglang_note": SGLANG_REFUSALS[method] + "."}
    return {"sglang": None, "sglang_note": NO_SERVER_EQUIVALENT.get(method, f"no SGLang equivalent known for {spec}")}


def _vllm_base(spec: str, method: str, k: int) -> dict | None:
    argument = spec.partition(":")[2]
    if method == "ngram":
        sizes = SpeculativeConfig.parse(spec, k)
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": sizes.ngram_min_n,
                "prompt_lookup_max": sizes.ngram_max_n}
    if method == "suffix":
        suffix = SpeculativeConfig.parse(spec, k)
        config = {"method": "suffix", "num_speculative_tokens": k,
                  "suffix_decoding_max_tree_depth": suffix.suffix_max_depth}
        return config if suffix.suffix_cache_tokens else dict(config, suffix_decoding_max_cached_requests=0)
    if method in _VLLM_METHODS and argument:
        return {"method": _VLLM_METHODS[method], "model": argument, "num_speculative_tokens": k}
    if method in HEADS and argument:
        return {"method": VLLM_METHODS[method], "model": export_dir(argument, "vllm"), "num_speculative_tokens": k}
    return None


def trtllm_config(spec: str, method: str) -> dict:
    """TensorRT-LLM's configuration for the drafters it has that vLLM and SGLang lack (lookahead)."""
    if method != "lookahead":
        return {"trtllm": None}
    sizes = SpeculativeConfig.parse(spec, 1)
    window, ngram, candidates = sizes.lookahead_window, sizes.lookahead_ngram, sizes.lookahead_candidates
    return {"trtllm": (f"speculative_config=LookaheadDecodingConfig(max_window_size={window}, "
                       f"max_ngram_size={ngram}, max_verification_set_size={candidates})"),
            "trtllm_yaml": (f"speculative_config:\n  decoding_type: Lookahead\n  max_window_size: {window}\n"
                            f"  max_ngram_size: {ngram}\n  max_verification_set_size: {candidates}")}
