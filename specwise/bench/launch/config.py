"""`specwise evaluate --engine vllm|sglang ...` settings: the servers specwise launches, one per arm.

--model (the in-process engine's flag) names the model the engine loads: a Hugging Face
directory or a name the engine resolves itself.
"""

from dataclasses import dataclass, fields

from specwise.bench.engine_flags import ENGINES
from specwise.bench.launch.command import DEFAULT_COMMANDS
from specwise.bench.launch.pool import ON_EXIT, PAIRINGS, LaunchSettings
from specwise.bench.load.config import check_positive, help_field
from specwise.errors import ConfigError

DEFAULT_BLOCKS = 4      # blocks per load point in the blocks pairing: A | B B | A, two restarts per point


@dataclass
class LaunchConfig:
    engine: str | None = help_field(f"launch one {' or '.join(ENGINES)} server per --methods arm (off, ngram@4, "
                                    "suffix, draft:MODEL@3, eagle3:MODEL ...) with the flags the recommendation "
                                    "writes, measure them paired, stop them")
    engine_cmd: str | None = help_field("how the engine is started, e.g. '/venv/bin/python -m "
                                        "vllm.entrypoints.openai.api_server' or a container command; none: "
                                        + " / ".join(f"'{cmd}'" for cmd in DEFAULT_COMMANDS.values()))
    engine_args: str | None = help_field("more engine flags for every arm, e.g. '--max-model-len 2048 --dtype bfloat16'")
    pairing: str = help_field("side-by-side (every arm's server up at once, rounds interleaved), blocks (one "
                              "server at a time, restarted at each change of arm: A | B B | A ...) or auto "
                              "(side-by-side with --cores or --devices, else blocks)", "auto")
    cores: str | None = help_field("CPU cores per arm's server, '/'-separated in arm order, e.g. 0/1 or 0-3/4-7 "
                                   "(taskset; vLLM's OpenMP threads bound to them)")
    devices: str | None = help_field("GPUs per arm's server, '/'-separated in arm order, e.g. 0/1 "
                                     "(CUDA_VISIBLE_DEVICES)")
    blocks: int = help_field("blocks per load point in the blocks pairing (requests split evenly)", DEFAULT_BLOCKS)
    start_timeout: float = help_field("seconds for a server to answer /health after its start", 900.0)
    on_server_exit: str = help_field("when a server exits mid-run: continue (its requests count as errors) or "
                                     "stop (what finished is kept)", "continue")
    dry_run: bool = help_field("print every command --engine would launch, and stop", False)

    def __post_init__(self):
        if self.engine is not None and self.engine not in ENGINES:
            raise ConfigError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.pairing not in PAIRINGS:
            raise ConfigError(f"--pairing must be one of {', '.join(PAIRINGS)}, got {self.pairing!r}")
        if self.on_server_exit not in ON_EXIT:
            raise ConfigError(f"--on-server-exit must be one of {', '.join(ON_EXIT)}, got {self.on_server_exit!r}")
        check_positive(self, "blocks")
        check_positive(self, "start_timeout")
        used = [f.name for f in fields(self) if f.name != "engine" and getattr(self, f.name) != f.default]
        if self.engine is None and used:
            raise ConfigError(f"--{used[0].replace('_', '-')} needs --engine vllm|sglang")

    def settings(self, model: str | None, k: int) -> LaunchSettings:
        if not model:
            raise ConfigError("--engine needs --model: the model the engine loads (a Hugging Face directory "
                              "or a name it resolves)")
        return LaunchSettings(engine=self.engine, model=model, engine_cmd=self.engine_cmd,
                              engine_args=self.engine_args, cores=self.cores, devices=self.devices,
                              pairing=self.pairing, start_timeout=self.start_timeout,
                              on_server_exit=self.on_server_exit, blocks=self.blocks, dry_run=self.dry_run, k=k)
