"""Arms: what is compared side by side.

In-process methods, `--methods off,ngram,suffix,lookahead:W,N,G,draft:PATH,layer_skip:L,eagle[:DIR],
medusa[:DIR]` (eagle / medusa without DIR: the built-in head for the target); an optional `@k`
suffix sets that arm's draft length (`ngram@2,ngram@6`), otherwise --num-speculative-tokens
applies (for lookahead: its prompt-lookup candidate's length; the arm is named
lookahead-wWnNgG-kK). Endpoints, `--endpoint NAME=URL` (repeatable); the method is read from
the name (`vllm-off`, `sglang-eagle`, `ngram`, `trtllm-lookahead`...), "http" if none.
Engine arms, `--engine vllm|sglang --methods off,ngram@4,suffix,draft:MODEL@3,eagle3:MODEL`: one
server per method, launched by specwise (bench/launch/) with the flags of bench/engine_flags.py;
named like in-process arms (`off`, `ngram-k4`, `eagle3-MODELNAME-k3`). eagle:DIR / medusa:DIR naming our own
head (a drafter.json) is exported to the engine's format first (bench/launch/exports.py).
"""

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from specwise.bench.engine_flags import SERVER_FORMS, SERVER_METHODS, speculative_flags
from specwise.engine.spec_decode.config import MAX_SPECULATIVE_TOKENS, SpeculativeConfig
from specwise.errors import ConfigError

_OFF_WORDS = ("off", "base", "baseline", "nospec", "no-spec", "plain")
# one method per match: lookahead:W,N,G keeps its commas, anything else ends at a comma
_METHOD = re.compile(r"\s*lookahead\s*:\s*\d+\s*,\s*\d+\s*,\s*\d+[^,]*|[^,]+", re.IGNORECASE)


@dataclass
class ArmSpec:
    name: str
    method: str             # off, ngram, suffix, lookahead, draft, layer_skip, eagle, medusa; http (an endpoint of
                            # unknown method)
    spec: str | None        # engine drafter string ("ngram", "draft:PATH", ...); None = off
    k: int | None           # draft tokens per step; 0 for off; None if unknown (endpoints)
    url: str | None = None
    engine: str | None = None   # "vllm" / "sglang": a server specwise launches for this arm
    exported_from: str | None = None    # our head's directory when spec names its export (launch/exports.py)

    def to_dict(self) -> dict:
        return asdict(self)


def parse_methods(text: str, default_k: int) -> list[ArmSpec]:
    arms = [_method_arm(part.strip(), default_k) for part in _METHOD.findall(text) if part.strip()]
    if not arms:
        raise ConfigError("--methods: give at least one method, e.g. off,ngram")
    return _unique(arms)


def parse_engine_methods(text: str, engine: str, default_k: int) -> list[ArmSpec]:
    """`--engine` arms: the methods a server can run (SERVER_FORMS), each checked by the translation."""
    arms = []
    for part in (part.strip() for part in text.split(",")):
        if not part:
            continue
        spec, _, k_text = part.rpartition("@") if "@" in part else (part, "", "")
        spec, k = spec.strip(), _k(k_text, part) if k_text else default_k
        method = spec.partition(":")[0].strip().lower()
        if method in ("off", "none"):
            arms.append(ArmSpec(name="off", method="off", spec=None, k=0, engine=engine))
            continue
        if method not in SERVER_METHODS:
            raise ConfigError(f"--methods {part!r}: with --engine use {SERVER_FORMS}")
        if method in ("ngram", "suffix"):
            SpeculativeConfig.parse(spec, k)                # the sizes' own check
        speculative_flags(engine, spec, method, k)          # a method the engine lacks stops here
        argument = spec.partition(":")[2].strip()
        label = method if method in ("ngram", "suffix") else f"{method}-{Path(argument).name or argument}"
        arms.append(ArmSpec(name=f"{label}-k{k}", method=method, spec=spec, k=k, engine=engine))
    if not arms:
        raise ConfigError("--methods: give at least one method, e.g. off,ngram@4")
    return _unique(arms)


def parse_endpoints(values: list[str]) -> list[ArmSpec]:
    arms = []
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not name.strip() or not url.strip():
            raise ConfigError(f"--endpoint: expected NAME=URL, got {value!r}")
        name = name.strip()
        method = infer_method(name)
        arms.append(ArmSpec(name=name, method=method, spec=None if method in ("off", "http") else method,
                            k=0 if method == "off" else None, url=url.strip()))
    return _unique(arms)


def infer_method(name: str) -> str:
    words = name.lower().replace("_", "-").split("-")
    if any(word in _OFF_WORDS for word in words):
        return "off"
    for method in ("ngram", "suffix", "lookahead", "draft", "eagle", "medusa"):
        if any(word.startswith(method) for word in words):
            return method
    return "layer_skip" if "layer-skip" in name.lower().replace("_", "-") else "http"


def _method_arm(text: str, default_k: int) -> ArmSpec:
    spec, _, k_text = text.rpartition("@") if "@" in text else (text, "", "")
    k = _k(k_text, text) if k_text else default_k
    if spec.strip().lower() in ("off", "none"):
        return ArmSpec(name="off", method="off", spec=None, k=0)
    parsed = SpeculativeConfig.parse(spec, k)               # the engine's own check of the drafter text
    if parsed.method == "lookahead":
        sizes = (parsed.lookahead_window, parsed.lookahead_ngram, parsed.lookahead_candidates, k)
        return ArmSpec(name="lookahead-w{}n{}g{}-k{}".format(*sizes), method="lookahead", spec=parsed.label, k=k)
    argument = spec.partition(":")[2]
    label = parsed.method if not argument else f"{parsed.method}-{Path(argument).name or argument}"
    return ArmSpec(name=f"{label}-k{k}", method=parsed.method, spec=spec, k=k)


def _k(text: str, arm: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_SPECULATIVE_TOKENS:
        raise ConfigError(f"--methods: {arm!r}: @k must be an integer in 1..{MAX_SPECULATIVE_TOKENS}")
    return int(text)


def _unique(arms: list[ArmSpec]) -> list[ArmSpec]:
    names = [arm.name for arm in arms]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"arm given twice: {', '.join(duplicates)}")
    return arms
