"""vLLM for CPU side by side: a KV cache space per arm that lets every server start.

By default a vLLM-CPU server reserves --gpu-memory-utilization (0.92) of the machine's memory
and refuses to start when less is available, so a second server side by side dies at start-up
("Available memory ... is less than desired CPU memory utilization"). An explicit KV cache size
(VLLM_CPU_KVCACHE_SPACE, GiB, or --kv-cache-memory-bytes) skips that reservation (read in vllm-cpu
0.32.0's v1/worker/cpu_worker.py and platforms/cpu.py). So when arms run side by side without
--devices and the user chose none of VLLM_CPU_KVCACHE_SPACE (environment or --engine-cmd),
--kv-cache-memory-bytes or --gpu-memory-utilization (--engine-args), each arm gets
VLLM_CPU_KVCACHE_SPACE = SHARE of the available memory / arms, in whole GiB (at least 1); on a GPU
the variable is ignored. Worked example: 22.4 GiB available, 2 arms -> 5 GiB each.
"""

import os
import shlex

KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
USER_FLAGS = ("--kv-cache-memory-bytes", "--gpu-memory-utilization")
SHARE = 0.5         # of the available memory for all arms' KV caches: the rest holds weights and processes
GIB = 1 << 30


def kv_cache_share(arms: int, engine_cmd: str | None, engine_args: str | None, environ=os.environ,
                   available: int | None = None) -> tuple[dict[str, str], str | None]:
    """(environment for every arm's server, the note saying so); ({}, None) when the user chose a size."""
    if arms < 2 or KV_ENV in environ or KV_ENV in (engine_cmd or ""):
        return {}, None
    if any(word.split("=")[0] in USER_FLAGS for word in shlex.split(engine_args or "")):
        return {}, None
    available = available_memory() if available is None else available
    if available is None:
        return {}, None
    share = max(1, int(available * SHARE / arms / GIB))
    return {KV_ENV: str(share)}, (
        f"vLLM for CPU side by side: each of the {arms} servers gets {KV_ENV}={share} (GiB of KV cache: "
        f"{SHARE:.0%} of the {available / GIB:.1f} GiB available, split per arm; by default each would reserve "
        f"92% of memory and the second would not start); set {KV_ENV} or --engine-args "
        "'--kv-cache-memory-bytes N' to choose")


def available_memory() -> int | None:
    """Bytes of memory available now (Linux MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
