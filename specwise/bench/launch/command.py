"""The command line that starts one arm's server: engine, model, loopback port, the arm's
speculative flags (bench/engine_flags.py, the recommendation's own), --engine-args, and
where it runs (its own CPU cores through `taskset`, its own GPUs through
CUDA_VISIBLE_DEVICES).

Worked example: engine vllm, --engine-cmd "vllm serve", model /m, arm ngram@4, port 8123,
cores "1" ->
  VLLM_CPU_OMP_THREADS_BIND=1 taskset -c 1 vllm serve /m --host 127.0.0.1 --port 8123
      --speculative-config '{"method": "ngram", ...}' --per-request-spec-decode-metrics summary
`vllm serve` takes the model as its first argument; any other vLLM command (the OpenAI
server module, a container's entry point) gets `--model MODEL`; SGLang `--model-path MODEL`.
"""

import os
import shlex
import socket
from dataclasses import dataclass, field

from specwise.bench.engine_flags import command_text, speculative_flags
from specwise.bench.load.arms import ArmSpec
from specwise.errors import ConfigError

HOST = "127.0.0.1"
DEFAULT_COMMANDS = {"vllm": "vllm serve", "sglang": "python -m sglang.launch_server"}
# vLLM (0.32) returns each request's acceptance under metrics.speculative_decoding with this flag;
# it refuses the flag on a server without speculation, so only speculating arms get it.
PER_REQUEST_METRICS = ["--per-request-spec-decode-metrics", "summary"]


@dataclass(frozen=True)
class ServerCommand:
    arm: str
    argv: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)     # added to this process's environment

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def text(self) -> str:
        """The shell line, environment first: what --dry-run prints and run.json keeps."""
        prefix = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(self.env.items()))
        return f"{prefix} {command_text(self.argv)}".strip()


def engine_words(engine: str, engine_cmd: str | None) -> list[str]:
    words = shlex.split(engine_cmd or DEFAULT_COMMANDS[engine])
    if not words:
        raise ConfigError("--engine-cmd is empty; e.g. --engine-cmd 'vllm serve'")
    return words


def build_command(engine: str, engine_cmd: str | None, model: str, arm: ArmSpec, port: int,
                  engine_args: str | None = None, cores: str | None = None, devices: str | None = None,
                  per_request_metrics: bool = True, env: dict[str, str] | None = None) -> ServerCommand:
    """`env`: more environment for the server (vLLM-CPU's KV cache share: launch/memory.py)."""
    words = engine_words(engine, engine_cmd)
    if engine == "vllm":
        model_words = [model] if words[-1] == "serve" else ["--model", model]
    else:
        model_words = ["--model-path", model]
    argv = words + model_words + ["--host", HOST, "--port", str(port)]
    spec = speculative_flags(engine, arm.spec, arm.method, arm.k or 0)
    argv += spec
    if spec and engine == "vllm" and per_request_metrics:
        argv += PER_REQUEST_METRICS
    argv += shlex.split(engine_args or "")
    env = dict(env or {})
    if cores is not None:
        argv = ["taskset", "-c", cores] + argv
        if engine == "vllm":            # vLLM for CPU binds its OpenMP threads itself: to these cores
            env["VLLM_CPU_OMP_THREADS_BIND"] = cores
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    return ServerCommand(arm=arm.name, argv=argv, port=port, env=env)


def split_sets(text: str | None, arms: int, flag: str) -> list[str | None]:
    """--cores 0/1 or --devices 0,1/2,3: one set per arm, '/'-separated; none: [None] * arms."""
    if text is None:
        return [None] * arms
    sets = [part.strip() for part in text.split("/")]
    if len(sets) != arms or not all(sets):
        raise ConfigError(f"{flag} {text!r}: give one set per arm ({arms}), '/'-separated, e.g. "
                          f"{'/'.join(str(i) for i in range(arms))}")
    return sets


def check_cores(sets: list[str | None]) -> None:
    """Every core named must be one this process may run on (taskset would fail later, less clearly)."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    for cores in sets:
        if cores is None or allowed is None:
            continue
        named = _core_list(cores)
        if not named <= allowed:
            raise ConfigError(f"--cores {cores!r}: cores {sorted(named - allowed)} are not available here "
                              f"(available: {sorted(allowed)})")


def _core_list(text: str) -> set[int]:
    """'0-2,5' -> {0, 1, 2, 5}."""
    cores = set()
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            cores.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise ConfigError(f"--cores: expected core lists like 0-3,6 per arm, got {text!r}") from None
    return cores


def free_port() -> int:
    """A port nothing listens on now, on the loopback interface."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]
