"""The model's forward compiled by inductor (`--compile`): one graph for every step.

Eager decoding runs ~30 small ops a layer between the matmuls, and each costs 2-3x what it costs
alone (docs/engine.md): the weights streaming through have evicted the caches. Inductor fuses them
(norm and scale, rotary, silu times up, the residual adds into the matmuls as oneDNN post-ops) and,
with `freezing`, takes the weights as constants: it prepacks each linear for oneDNN itself, so the
forward's Linear layers stay plain nn.Linear (quantize.pack_weights packs only the LM head, which
runs outside the graph on the rows that are sampled).

Attention is one opaque op (attention.py) that reads the step's metadata from `step_metadata`, so
the graph does not depend on how a step mixes prefills, decodes and verification: the token count
is its one dynamic size. Inductor specializes sizes 0 and 1, so there are two graphs, one token and
more than one; `warm_up` compiles both before the first request (20-40 s each on two cores, at every
start: with freezing, inductor's disk cache did not shorten a second start). A layer-skip drafter's
shorter forward is a third graph, compiled at its first step.

Measured on the 2-core VM (default model, bf16, decode steps compiled / eager, interleaved, see
docs/engine.md): 0.90x at batch 1, 0.91x at 4, 0.95x at 16. Logits move within bf16 rounding; greedy
exactness holds because drafting and plain decoding run the same graphs.
"""

import sys
import time

import torch

from specwise.models.attention import AttentionMetadata, PrefillChunk, step_metadata
from specwise.models.llama import LlamaForCausalLM


def compile_forward(model: LlamaForCausalLM, kv_cache: torch.Tensor):
    """model's forward, compiled now (both graphs, see warm_up): same arguments, same result (within
    rounding). Freezing is set in inductor's global config: passed as an option (`torch.compile(options=...)`)
    it did not reach the passes that prepack the linears (torch 2.13: plain matmuls, 1.3x slower than eager)."""
    torch._inductor.config.freezing = True
    # dynamic=None: the first graph is static (1 token), the second makes only what changed dynamic (the token
    # count); dynamic=True also made the cache's sizes symbolic, and "duck sizing" then tied a 2-token warm-up
    # to the cache's 2 (keys, values): every other token count recompiled
    forward = torch.compile(model, dynamic=None)
    warm_up(forward, kv_cache)
    return forward


@torch.inference_mode()
def warm_up(forward, kv_cache: torch.Tensor) -> None:
    """Compile both graphs: prefills of 1 and 2 tokens written to slots 0 and 1 (block 0: any sequence
    that later holds it writes its own keys there before reading them). Says so on stderr: it takes a while."""
    print("specwise: compiling the model's forward (--compile; about a minute on two cores)", file=sys.stderr,
          flush=True)
    started = time.perf_counter()
    for num_tokens in (1, 2):
        slots = torch.arange(num_tokens, device=kv_cache.device)
        with step_metadata(AttentionMetadata(slots, [PrefillChunk(0, num_tokens)], [])):
            forward(torch.zeros(num_tokens, dtype=torch.long, device=kv_cache.device), slots, kv_cache)
    print(f"specwise: compiled in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
