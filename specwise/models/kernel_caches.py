"""A bound on the CPU kernels' per-shape caches, for a process that serves for hours.

oneDNN keeps every primitive it built (the JIT-compiled matmul for one weight and one input shape) in a
cache of ONEDNN_PRIMITIVE_CACHE_CAPACITY entries, and PyTorch's ideep layer keeps its own per-shape state
in one of LRU_CACHE_CAPACITY entries; both default to 1,024 and are read once, when the first kernel runs.
A flat step's token count changes from step to step (decodes, draft rows, prompt chunks), so a server
meets new shapes for hours: with the default model in bf16 each new token count added ~2.2 MiB of live
heap (half in each cache; glibc's mallinfo2, benchmarks/memory_watch.py), ~26 MiB a minute in a soak
(`benchmarks/soak.py --diagnose-memory`), until 1,024 entries each, several hundred MiB later.

Worked example: after 10 prompts, 50 more of 50 new lengths, one at a time: live heap +113 MiB with the
defaults, +0.6 MiB with both caches at 8 entries.

`bound_kernel_caches()` sets both to KERNEL_CACHE_ENTRIES unless the environment already says otherwise;
it has to run before the first kernel does (`specwise serve` calls it before building the engine). A
shape that fell out of the cache is built again when it comes back.
"""

import os
from typing import MutableMapping

KERNEL_CACHE_ENTRIES = 128          # per cache: ~0.2 MiB an entry with the default model, ~30 MiB each when full
CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_kernel_caches(entries: int = KERNEL_CACHE_ENTRIES,
                        environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Each cache's capacity in effect: `entries` unless the environment sets it already."""
    return {name: environ.setdefault(name, str(entries)) for name in CACHE_VARIABLES}
