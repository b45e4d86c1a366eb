"""The model's forward compiled by inductor (`--compile`): a few graphs serve every step.

Eager decoding runs ~30 small ops a layer between the matmuls, and each costs 2-3x what it costs
alone (docs/engine.md): the weights streaming through have evicted the caches. Inductor fuses them
(norm and scale, rotary, silu times up, the residual adds) and, with `freezing`, takes the weights
as constants.

Attention is one opaque op (attention.py) that reads the step's metadata from `step_metadata`, so
a graph does not depend on how a step mixes prefills, decodes and verification: the token count
is its one size that changes. Steps of up to 4 tokens (decoding a few sequences, verifying a few
drafts) are padded to a bucket of 1, 2 or 4 tokens, each its own static graph whose matmuls are
inductor's C++ GEMM template (`max_autotune` with the CPP backend alone: generated for that row
count, it reads bf16 weights ~1.5x faster than oneDNN's packed linear at one row; the only choice,
so nothing is benchmarked). Larger steps (prefill chunks, large batches) run one graph with a
dynamic token count and oneDNN's linears, prepacked by freezing: the template generated for one
hint of a dynamic count ran 2x slower at 16 rows and 4x slower on a 163-token prefill, and a
static bucket of 8 rows, autotuned, was 1.05-1.15x slower than the dynamic graph. The padding rows
attend to nothing and write no cache slot (attention.py); 3 rows padded to 4 cost what 4 do.

`CompiledForward` compiles every graph before the first request (minutes on two cores, at every
start: with freezing, inductor's disk cache did not shorten a second start). A layer-skip drafter's
shorter forward is four more graphs, compiled when the drafter is set up (`warm_up(num_layers=L)`),
not in the middle of its first requests. The LM head runs on the rows that are sampled, in graphs
of its own bucketed the same way (`compute_logits`): the template reads it ~1.4x faster than
oneDNN's packed linear at one row. A quantized LM head (int8) runs its kernel.

Measured on the 2-core VM (default model, bf16), see docs/engine.md.
"""

import sys
import time

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specwise.errors import ConfigError
from specwise.models.attention import AttentionMetadata, PrefillChunk, step_metadata
from specwise.models.llama import LlamaForCausalLM

BUCKETS = (1, 2, 4)             # token counts with a static graph (C++ GEMM template); steps are padded up to one
DYNAMIC_WARM_UP = 16            # the dynamic graph's first token count (its size hint)


class _Static(torch.nn.Module):
    """The model (forward, compute_logits) under other code objects: dynamo keeps a cache of graphs per code
    object, so the static buckets' graphs never meet the dynamic ones (a bucket's call would match the dynamic
    graph's guards)."""

    def __init__(self, model: LlamaForCausalLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids, positions, kv_cache, num_layers=None):
        return self.model(input_ids, positions, kv_cache, num_layers)

    def compute_logits(self, hidden):
        return self.model.compute_logits(hidden)


class CompiledForward:
    """model's forward, compiled (all graphs at construction): same arguments, same result within rounding."""

    def __init__(self, model: LlamaForCausalLM, kv_cache: torch.Tensor):
        # freezing in inductor's global config: passed as an option (`torch.compile(options=...)`) it did not
        # reach the passes that prepack the linears (torch 2.13: plain matmuls, 1.3x slower than eager)
        torch._inductor.config.freezing = True
        # each bucket is a graph, and so is each layer-skip depth at each bucket
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        # no guards on the modules: with freezing the graphs hold the weights as constants, so they already
        # assume the model never changes; dynamo checked its ~300 parameters before every call (0.8 ms a step)
        options = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
        static = _Static(model)
        self.static = torch.compile(static, dynamic=False, options=options)
        self.static_logits = torch.compile(static.compute_logits, dynamic=False, options=options)
        # dynamic=None and the token count marked dynamic at the first call: only that size is symbolic
        # (dynamic=True also made the cache's sizes symbolic, and "duck sizing" tied a token count of 2 to
        # the cache's 2, keys and values: every other count recompiled)
        self.dynamic = torch.compile(model, dynamic=None, options=options)
        self.dynamic_logits = torch.compile(model.compute_logits, dynamic=None, options=options)
        self.model = model
        # int8/int4 LM heads run their own kernels, not inductor's: eagerly
        self.logits_compiled = isinstance(model.lm_head, torch.nn.Linear)
        try:
            self.warm_up(kv_cache)
        except torch._dynamo.exc.BackendCompilerFailed as error:
            reason = str(error).strip().splitlines()[0]
            raise ConfigError(f"--compile: inductor could not compile the model ({reason}). The usual cause is no "
                              f"working C++ compiler (it needs g++ or clang++ on PATH, or CXX=...); --no-compile runs "
                              f"the model without inductor") from error

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                 num_layers: int | None = None) -> torch.Tensor:
        num_tokens = input_ids.shape[0]
        bucket = _bucket(num_tokens)
        if bucket is None:
            return self.dynamic(input_ids, positions, kv_cache, num_layers)
        padding = (0, bucket - num_tokens)
        hidden = self.static(F.pad(input_ids, padding), F.pad(positions, padding), kv_cache, num_layers)
        return hidden[:num_tokens]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's compute_logits, compiled: rows padded to a bucket (none: to 1) or the dynamic graph."""
        if not self.logits_compiled:
            return self.model.compute_logits(hidden)
        num_rows = hidden.shape[0]
        bucket = _bucket(num_rows)
        if bucket is None:
            return self.dynamic_logits(hidden)
        return self.static_logits(F.pad(hidden, (0, 0, 0, bucket - num_rows)))[:num_rows]

    @torch.inference_mode()
    def warm_up(self, kv_cache: torch.Tensor, num_layers: int | None = None) -> None:
        """Compile every graph of a forward through the first num_layers layers (None: all): prefills written to
        the first slots (any sequence that later holds those blocks writes its own keys there before reading
        them). A progress bar on stderr: it takes minutes."""
        started = time.perf_counter()
        sizes = BUCKETS + (DYNAMIC_WARM_UP,)
        depth = "" if num_layers is None else f" {num_layers}-layer"
        columns = (TextColumn("specwise: compiling the {task.fields[graph]} graph"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, console=Console(stderr=True)) as progress:
            task = progress.add_task("compile", total=len(sizes), graph="")
            for num_tokens in sizes:
                input_ids = torch.zeros(num_tokens, dtype=torch.long, device=kv_cache.device)
                slots = torch.arange(num_tokens, device=kv_cache.device)
                with step_metadata(AttentionMetadata(slots, [PrefillChunk(0, num_tokens)], [])):
                    if num_tokens in BUCKETS:
                        progress.update(task, graph=f"{num_tokens}-token{depth}")
                        with torch._inductor.config.patch(max_autotune=True, max_autotune_gemm_backends="CPP"):
                            self.compute_logits(self.static(input_ids, slots, kv_cache, num_layers))
                    else:
                        progress.update(task, graph=f">{BUCKETS[-1]}-token{depth}")
                        torch._dynamo.mark_dynamic(input_ids, 0)
                        torch._dynamo.mark_dynamic(slots, 0)
                        hidden = self.dynamic(input_ids, slots, kv_cache, num_layers)
                        torch._dynamo.mark_dynamic(hidden, 0)
                        self.compute_logits(hidden)
                progress.advance(task)
        print(f"specwise: compiled in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)


def _bucket(num_rows: int) -> int | None:
    """The smallest static graph's size that holds num_rows (0 rows: the 1-row graph); None above them all."""
    return next((size for size in BUCKETS if size >= max(num_rows, 1)), None)
