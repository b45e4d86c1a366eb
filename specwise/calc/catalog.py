"""Hardware and model catalogs: spec-sheet figures, each entry with its source.

`get_gpu` and `get_model` take a catalog name (or alias, any case and punctuation),
or a path to a JSON file: a GPU in the catalog's own format, a model in the catalog's
format or a Hugging Face config.json. `overrides` ("field=value" strings, from
`--gpu-set` / `--model-set`) change single figures of the chosen entry.
"""

import dataclasses
import json
import re
import typing
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from specwise.errors import ConfigError, InputError

GIB = 2 ** 30
_ARCHITECTURE = {"num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                 "vocab_size", "tie_word_embeddings", "attention_bias"}


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_gb: float                 # as stated on the spec sheet; read as GiB
    bandwidth_gbs: float             # peak memory bandwidth, GB/s
    bf16_tflops: float               # dense tensor-core peak
    fp8_tflops: float | None = None  # dense; None: no FP8 tensor cores
    interconnect_gbs: float = 64.0   # GPU-to-GPU, bidirectional, as vendors state it
    interconnect: str = ""
    source: str = "user supplied"
    aliases: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("memory_gb", "bandwidth_gbs", "bf16_tflops", "interconnect_gbs"):
            _require_positive(self, name)
        if self.fp8_tflops is not None:
            _require_positive(self, "fp8_tflops")

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * GIB


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    num_parameters: int = 0          # 0: count from the architecture
    hf_id: str = ""
    published_parameters: str = ""
    source: str = "user supplied"
    aliases: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size"):
            _require_positive(self, name)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"model {self.name}: num_heads ({self.num_heads}) must be a multiple of "
                              f"num_kv_heads ({self.num_kv_heads})")
        if self.num_parameters == 0:
            object.__setattr__(self, "num_parameters", self.architecture_parameters())
        _require_positive(self, "num_parameters")

    def architecture_parameters(self) -> int:
        """Weights counted from the shapes; a tied embedding counts once."""
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (2 * q_width + 2 * kv_width)
        if self.attention_bias:
            attention += q_width + 2 * kv_width
        mlp = 3 * self.hidden_size * self.intermediate_size
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * (attention + mlp + 2 * self.hidden_size) + embeddings + self.hidden_size

    @property
    def streamed_parameters(self) -> int:
        """Weights every forward reads and multiplies: all but an untied input embedding (a gather)."""
        if self.tie_word_embeddings:
            return self.num_parameters
        return self.num_parameters - self.vocab_size * self.hidden_size

    def kv_bytes_per_token(self, kv_bytes: float) -> float:
        """K and V of one token in every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_bytes

    @classmethod
    def from_hf_config(cls, hf: dict, name: str, source: str) -> "ModelSpec":
        try:
            heads = hf["num_attention_heads"]
            return cls(name=name, num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
                       num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
                       head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
                       intermediate_size=hf["intermediate_size"], vocab_size=hf["vocab_size"],
                       tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                       attention_bias=bool(hf.get("attention_bias", hf.get("model_type") == "qwen2")),
                       source=source)
        except KeyError as missing:
            raise InputError(f"{source}: config.json lacks {missing}") from None


def _require_positive(spec, name: str) -> None:
    value = getattr(spec, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{spec.name}: {name} must be a positive number, got {value!r}")


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", name.lower())


@cache
def _catalog(kind: str) -> dict:
    text = resources.files("specwise.calc").joinpath("data", f"{kind}.json").read_text(encoding="utf-8")
    cls = GPUSpec if kind == "gpus" else ModelSpec
    entries = {}
    for entry in json.loads(text)[kind]:
        spec = cls(**{**entry, "aliases": tuple(entry.get("aliases", ()))})
        for name in (spec.name, *spec.aliases):
            entries[_key(name)] = spec
    return entries


def gpu_names() -> list[str]:
    return sorted({spec.name for spec in _catalog("gpus").values()})


def model_names() -> list[str]:
    return sorted({spec.name for spec in _catalog("models").values()})


def get_gpu(name_or_path: str, overrides: list[str] | tuple = ()) -> GPUSpec:
    spec = _lookup("gpus", name_or_path, gpu_names)
    return _override(spec, overrides, "--gpu-set")


def get_model(name_or_path: str, overrides: list[str] | tuple = ()) -> ModelSpec:
    spec = _lookup("models", name_or_path, model_names)
    return _override(spec, overrides, "--model-set")


def _lookup(kind: str, name_or_path: str, names):
    path = Path(name_or_path)
    if path.suffix == ".json" or path.is_file():
        return _from_file(kind, path)
    spec = _catalog(kind).get(_key(name_or_path))
    if spec is None:
        raise ConfigError(f"unknown {kind[:-1]} {name_or_path!r}; choose one of {', '.join(names())} "
                          f"or pass a JSON file")
    return spec


def _from_file(kind: str, path: Path):
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: not valid JSON ({error.msg}, line {error.lineno})") from None
    if kind == "models" and "num_hidden_layers" in data:
        return ModelSpec.from_hf_config(data, name=data.get("_name_or_path") or path.parent.name or path.stem,
                                        source=str(path))
    cls = GPUSpec if kind == "gpus" else ModelSpec
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InputError(f"{path}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    data.setdefault("name", path.stem)
    data.setdefault("source", str(path))
    try:
        return cls(**{**data, "aliases": tuple(data.get("aliases", ()))})
    except TypeError as error:
        raise InputError(f"{path}: {error}") from None


def _override(spec, overrides, flag: str):
    if not overrides:
        return spec
    kinds = typing.get_type_hints(type(spec))
    changes = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in kinds or key == "aliases":
            raise ConfigError(f"{flag} {item!r}: expected FIELD=VALUE with FIELD one of "
                              f"{', '.join(n for n in kinds if n != 'aliases')}")
        changes[key] = _parse_value(text.strip(), kinds[key], flag, item)
    if isinstance(spec, ModelSpec) and "num_parameters" not in changes and set(changes) & _ARCHITECTURE:
        changes["num_parameters"] = 0
    changed = dataclasses.replace(spec, **changes)
    return dataclasses.replace(changed, source=f"{spec.source}; changed: {', '.join(overrides)}")


def _parse_value(text: str, kind, flag: str, item: str):
    """Parse by the field's type: bool, int, float (float | None takes 'none'), str."""
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "1")
        if kind is int:
            return int(text)
        if kind is str:
            return text
        if text.lower() in ("none", "null") and type(None) in typing.get_args(kind):
            return None
        return float(text)
    except ValueError:
        raise ConfigError(f"{flag} {item!r}: {text!r} is not a valid value") from None
