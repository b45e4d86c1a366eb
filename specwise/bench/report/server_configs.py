"""Ready-to-paste serving configuration for a drafter that paid in the evaluation.

The flags themselves come from the one translation, bench/engine_flags.py, which the
launcher (`specwise evaluate --engine`) uses too: what is measured is what is recommended.
Here: the dynamic variant, which adds `num_speculative_tokens_per_batch_size` to vLLM's
config, a list of [lo, hi, k] batch-size ranges (KTable.to_vllm_ranges; k = 0 turns
speculation off in that range; it needs a vLLM release with dynamic speculative decoding),
the shell text of each, and the notes for methods a server lacks.
Our eagle:DIR / medusa:DIR heads point at DIR/export-vllm, with the export command in the note.
Lookahead decoding: vLLM and SGLang have none; TensorRT-LLM's LLM API takes
`speculative_config=LookaheadDecodingConfig(max_window_size=W, max_ngram_size=N,
max_verification_set_size=G)` (our W, N, G), also given to trtllm-serve as
`speculative_config: {decoding_type: Lookahead, ...}` in --extra_llm_api_options.
"""

from specwise.bench.engine_flags import (HEADS, VLLM_NEEDS, command_text, note, sglang_flags as sglang_words,
                                        vllm_flags, vllm_speculative_config)
from specwise.engine.spec_decode.config import SpeculativeConfig
from specwise.engine.spec_decode.k_table import KTable
from specwise.models.export.export_formats import export_command


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


def vllm_config(spec: str, method: str, k: int, table: list[list[int]], checkpoint: str = "specwise") -> dict:
    base = vllm_speculative_config(spec, method, k, checkpoint)
    if base is None:
        return {"vllm": None, "vllm_dynamic": None, "vllm_note": note("vLLM", spec, method)}
    dynamic = None
    if table and len({row[2] for row in table}) > 1:
        dynamic = dict(base, num_speculative_tokens=max(row[2] for row in table),
                       num_speculative_tokens_per_batch_size=table)
    return {"vllm": base, "vllm_dynamic": dynamic,
            "vllm_args": command_text(vllm_flags(base)),
            "vllm_dynamic_args": command_text(vllm_flags(dynamic)) if dynamic else None,
            "vllm_note": " ".join(filter(None, [
                VLLM_NEEDS.get(method),
                f"Export the head first: {export_command(spec.partition(':')[2], 'vllm')}."
                if method in HEADS and checkpoint == "specwise" else None,
                None if dynamic is None else
                                  "The batch-size table needs a vLLM release with dynamic speculative decoding "
                                  "(0.32 has it); older releases reject the key: use the fixed config there."]))}


def sglang_flags(spec: str, method: str, k: int, checkpoint: str = "specwise") -> dict:
    words = sglang_words(spec, method, k, checkpoint)
    if words is None:
        return {"sglang": None, "sglang_note": note("SGLang", spec, method)}
    return {"sglang": command_text(words), "sglang_note": ""}


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
