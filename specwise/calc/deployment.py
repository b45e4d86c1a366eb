"""A model on some GPUs: the settings every calculator and the simulator share.

`DeploymentConfig` holds the flags (`--model`, `--gpu`, `--tp`, dtypes, efficiencies);
`Deployment` is the resolved form with catalog entries and byte sizes, and answers
the memory question: do the weights fit, and how many tokens of KV cache are left.
"""

import dataclasses
from dataclasses import dataclass, field

from specwise.calc.catalog import GPUSpec, ModelSpec, get_gpu, get_model
from specwise.errors import ConfigError

WEIGHT_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
KV_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float8": "fp8", "fp8_e4m3": "fp8"}


def canonical_dtype(name: str, table: dict, what: str) -> str:
    key = DTYPE_ALIASES.get(name.lower(), name.lower())
    if key not in table:
        raise ConfigError(f"{what} must be one of {', '.join(table)}, got {name!r}")
    return key


@dataclass
class DeploymentConfig:
    model: str = field(default="llama-3.1-8b", metadata={
        "help": "target model: catalog name, catalog-format JSON or HF config.json"})
    gpu: str = field(default="h100-sxm", metadata={"help": "GPU: catalog name or JSON file"})
    tp: int = field(default=1, metadata={"help": "tensor-parallel GPU count"})
    weight_dtype: str = field(default="bf16", metadata={"help": "weights: bf16, fp16, fp8, int8, int4"})
    kv_dtype: str = field(default="bf16", metadata={"help": "KV cache: bf16, fp16, fp8"})
    gpu_memory_utilization: float = field(default=0.9, metadata={
        "help": "fraction of GPU memory for weights + KV cache"})
    mem_efficiency: float = field(default=0.8, metadata={"help": "achieved fraction of peak memory bandwidth"})
    compute_efficiency: float = field(default=0.6, metadata={"help": "achieved fraction of peak tensor FLOP/s"})
    forward_overhead_ms: float = field(default=0.0, metadata={
        "help": "fixed time added to every forward pass (launches, scheduling), ms"})
    allreduce_latency_us: float = field(default=5.0, metadata={
        "help": "fixed cost of one tensor-parallel all-reduce, microseconds"})
    gpu_set: list[str] = field(default_factory=list, metadata={
        "help": "change one GPU figure, e.g. bandwidth_gbs=3000"})
    model_set: list[str] = field(default_factory=list, metadata={
        "help": "change one model figure, e.g. num_layers=40"})

    def __post_init__(self):
        if self.tp < 1:
            raise ConfigError(f"tp must be >= 1, got {self.tp}")
        self.weight_dtype = canonical_dtype(self.weight_dtype, WEIGHT_BYTES, "weight_dtype")
        self.kv_dtype = canonical_dtype(self.kv_dtype, KV_BYTES, "kv_dtype")
        for name in ("gpu_memory_utilization", "mem_efficiency", "compute_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.forward_overhead_ms < 0 or self.allreduce_latency_us < 0:
            raise ConfigError("forward_overhead_ms and allreduce_latency_us must be >= 0")


@dataclass(frozen=True)
class MemoryPlan:
    weight_bytes_per_gpu: float
    usable_bytes_per_gpu: float
    kv_bytes_per_token: float        # all layers, all GPUs together (each GPU holds 1/tp)
    kv_capacity_tokens: int          # 0 when the weights alone do not fit

    @property
    def fits(self) -> bool:
        return self.kv_capacity_tokens > 0


@dataclass(frozen=True)
class Deployment:
    model: ModelSpec
    gpu: GPUSpec
    tp: int = 1
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    gpu_memory_utilization: float = 0.9
    mem_efficiency: float = 0.8
    compute_efficiency: float = 0.6
    forward_overhead_s: float = 0.0
    allreduce_latency_s: float = 5e-6

    @classmethod
    def from_config(cls, config: DeploymentConfig) -> "Deployment":
        return cls(model=get_model(config.model, config.model_set), gpu=get_gpu(config.gpu, config.gpu_set),
                   tp=config.tp, weight_dtype=config.weight_dtype, kv_dtype=config.kv_dtype,
                   gpu_memory_utilization=config.gpu_memory_utilization,
                   mem_efficiency=config.mem_efficiency, compute_efficiency=config.compute_efficiency,
                   forward_overhead_s=config.forward_overhead_ms / 1e3,
                   allreduce_latency_s=config.allreduce_latency_us / 1e6)

    def with_model(self, model: ModelSpec) -> "Deployment":
        """The same GPUs and settings running another model (a drafter)."""
        return dataclasses.replace(self, model=model)

    @property
    def weight_bytes(self) -> float:
        return self.model.num_parameters * WEIGHT_BYTES[self.weight_dtype]

    @property
    def kv_bytes_per_token(self) -> float:
        return self.model.kv_bytes_per_token(KV_BYTES[self.kv_dtype])

    @property
    def peak_flops_per_gpu(self) -> float:
        """FP8 weights run on FP8 tensor cores where the GPU has them; everything else at BF16 rate."""
        if self.weight_dtype == "fp8" and self.gpu.fp8_tflops:
            return self.gpu.fp8_tflops * 1e12
        return self.gpu.bf16_tflops * 1e12

    def label(self) -> str:
        return f"{self.model.name} on {self.tp}x {self.gpu.name} ({self.weight_dtype} weights, {self.kv_dtype} KV)"

    def memory_plan(self, drafter: "Deployment | None" = None, drafter_kv_fraction: float = 1.0) -> MemoryPlan:
        """KV capacity after weights. A drafter adds its weights and, per target token, its own KV
        (`drafter_kv_fraction` < 1 when it keeps a bounded KV budget)."""
        weights = self.weight_bytes + (drafter.weight_bytes if drafter else 0.0)
        per_token = self.kv_bytes_per_token
        if drafter is not None:
            per_token += drafter.kv_bytes_per_token * drafter_kv_fraction
        usable = self.gpu.memory_bytes * self.gpu_memory_utilization
        free_total = (usable - weights / self.tp) * self.tp
        capacity = int(free_total // per_token) if free_total > 0 else 0
        return MemoryPlan(weight_bytes_per_gpu=weights / self.tp, usable_bytes_per_gpu=usable,
                          kv_bytes_per_token=per_token, kv_capacity_tokens=capacity)
