"""`python -m specwise.engine.compile_worker SPEC`: compile an engine's graphs into the compile cache, in a process
of its own, while the engine serves eagerly (background_compile.py starts it and switches the engine over).

SPEC is JSON: {"config": the engine's EngineConfig fields, "threads": the engine's torch threads, "depths":
[null, L, ...] (the forwards to compile: all layers, a layer-skip drafter's L), "key": the cache entry's key
the engine expects}. The worker builds the same model as the engine (engine/target_model.py) and refuses to
compile if its key differs (its graphs would never be used).

Threads on a 2-core machine: the torch thread count is the engine's, since inductor writes it into the kernels
(and the key); it only runs each graph once here. The compiling itself is Python (export, lowering, code
generation) and one C++ compiler run per graph, so inductor's compile_threads is 1 (a second worker would
only add a pool of processes) and the process runs at nice NICENESS: the server's steps come first, the
compile takes the cycles they leave.

Exit 0: every graph is in the cache. Anything else: failed, the last stderr line "specwise: compile worker: WHY".
The worker ends with its parent (stdin reaches EOF: the parent died without stopping it), and on SIGTERM
(removing the package it was writing).
"""

import json
import os
import signal
import sys
import threading

import torch
import torch._inductor.config as inductor_config

from specwise.config import EngineConfig
from specwise.engine.target_model import build_target
from specwise.models.compile.graphs import DYNAMIC_WARM_UP, CompiledForward, GraphSet

NICENESS = 10
FAILED = "specwise: compile worker: "      # the prefix of the line that says why it failed


def main(argv: list[str]) -> int:
    os.nice(NICENESS)
    signal.signal(signal.SIGTERM, _terminated)
    threading.Thread(target=_exit_with_parent, name="specwise-parent-watch", daemon=True).start()
    try:
        spec = json.loads(argv[0])
        compile_graphs(EngineConfig(**spec["config"]), spec["threads"], tuple(spec["depths"]), spec["key"])
    except Exception as error:
        lines = str(error).strip().splitlines()
        print(f"{FAILED}{lines[0] if lines else type(error).__name__}", file=sys.stderr, flush=True)
        return 1
    return 0


def compile_graphs(config: EngineConfig, threads: int, depths: tuple[int | None, ...], key: dict) -> None:
    torch.set_num_threads(threads)
    inductor_config.compile_threads = 1
    target = build_target(config, for_compile=True)
    graph_set = GraphSet.of(target.model, target.dtype)
    differ = sorted(name for name in set(key) | set(graph_set.key) if key.get(name) != graph_set.key.get(name))
    if differ:
        raise RuntimeError(f"the model built here differs from the engine's (in {', '.join(differ)}); its graphs "
                           f"would not be used")
    model = target.model.config
    kv_cache = torch.zeros(model.num_hidden_layers, 2, model.num_key_value_heads, DYNAMIC_WARM_UP, model.head_dim,
                           dtype=target.dtype, device=config.device)       # the graphs take any slot count
    CompiledForward(target.model, kv_cache, graph_set, depths)


class _Terminated(Exception):
    pass


def _terminated(signum, frame):
    raise _Terminated("stopped (SIGTERM)")


def _exit_with_parent() -> None:
    sys.stdin.buffer.read()         # nothing is ever written: EOF when the parent closes the pipe or dies
    os._exit(3)


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(status)        # not sys.exit: the interpreter's shutdown aborts on the thread blocked reading stdin
