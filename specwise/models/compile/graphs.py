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

Each graph is exported (`torch.export`) and compiled ahead of time by AOTInductor into a package
kept on disk (cache.py): the first start compiles them (minutes on two cores, a line on
stderr per graph), later starts load them in seconds. inductor's own disk cache cannot keep them
(freezing's oneDNN-packed weights do not pickle), so torch.compile recompiled in full at every
start. `CompiledForward` has every graph ready before the first request; a layer-skip drafter's
shorter forward is four more graphs, ready when the drafter is set up (`warm_up(num_layers=L)`),
not in the middle of its first requests. The LM head runs on the rows that are sampled, in graphs
of its own bucketed the same way (`compute_logits`): the template reads it ~1.4x faster than
oneDNN's packed linear at one row. A quantized LM head (int8) runs its kernel.

Measured on the 2-core VM (default model, bf16), see docs/engine.md.
"""

import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from specwise.errors import ConfigError
from specwise.models.attention import AttentionMetadata, PrefillChunk, step_metadata
from specwise.models.compile.cache import CompileCache, entry_key, holds, note, source_digest
from specwise.models.llama import LlamaForCausalLM

BUCKETS = (1, 2, 4)             # token counts with a static graph (C++ GEMM template); steps are padded up to one
DYNAMIC_WARM_UP = 16            # the dynamic graphs' example token count
PROC_MAPS = "/proc/self/maps"
# the directory AOTInductor's loader unpacked a package into, from the path of a file it mapped from it:
# "/tmp/aotinductor_pTdbZE/.forward-4-li76zjmu/data/aotinductor/model/....wrapper.so" -> "/tmp/aotinductor_pTdbZE"
UNPACKED = re.compile(r"^(.*/aotinductor_[^/]+)/")
_LOADING = threading.Lock()

source_digest(sys.modules[__name__])       # this file as imported, part of every cache entry's key (cache.py)

# A graph's callable: its inputs as a list (the loader's boxed call, without the per-call parsing of the
# package's input spec that `AOTICompiledModel.__call__` does) -> its outputs as a list
Run = Callable[[list[torch.Tensor]], list[torch.Tensor]]


class _Forward(torch.nn.Module):
    """The forward through the first num_layers layers (None: all), tensors in and out, for export."""

    def __init__(self, model: LlamaForCausalLM, num_layers: int | None):
        super().__init__()
        self.model = model
        self.num_layers = num_layers

    def forward(self, input_ids, positions, kv_cache):
        return self.model(input_ids, positions, kv_cache, self.num_layers)


class _Logits(torch.nn.Module):
    def __init__(self, model: LlamaForCausalLM):
        super().__init__()
        self.model = model

    def forward(self, hidden):
        return self.model.compute_logits(hidden)


@dataclass(frozen=True)
class Graph:
    kind: str                       # "forward" or "logits"
    rows: int | None                # a bucket's token (row) count; None: the dynamic graph (more than the last)
    num_layers: int | None = None   # forward: through the first num_layers layers (None: all)

    @property
    def name(self) -> str:
        """The package's file name: forward-1, forward-n-2layers, logits-4, ..."""
        depth = "" if self.num_layers is None else f"-{self.num_layers}layers"
        return f"{self.kind}-{'n' if self.rows is None else self.rows}{depth}"

    def describe(self) -> str:
        size = f">{BUCKETS[-1]}" if self.rows is None else str(self.rows)
        if self.kind == "logits":
            return f"the LM head's {size}-row graph"
        depth = "" if self.num_layers is None else f" {self.num_layers}-layer"
        return f"the {size}-token{depth} graph"


@dataclass(frozen=True)
class GraphSet:
    """What the graphs are made for, taken from the model as --compile builds it (bf16 linears left plain for
    inductor to pack): the cache entry's key, and whether the LM head is compiled. A runner that serves eagerly
    while they compile packs its own weights meanwhile; the set still names the graphs of the unpacked model."""

    key: dict
    logits_compiled: bool

    @classmethod
    def of(cls, model: LlamaForCausalLM, dtype: torch.dtype) -> "GraphSet":
        # int8/int4 LM heads run their own kernels, not inductor's: eagerly
        return cls(entry_key(model, dtype, BUCKETS, sys.modules[__name__]), isinstance(model.lm_head, torch.nn.Linear))

    def graphs(self, num_layers: int | None = None) -> list[Graph]:
        """The graphs of a forward through the first num_layers layers (None: all, with the LM head's)."""
        graphs = [Graph("forward", rows, num_layers) for rows in BUCKETS + (None,)]
        if self.logits_compiled and num_layers is None:
            graphs += [Graph("logits", rows) for rows in BUCKETS + (None,)]
        return graphs

    def count(self, depths: tuple[int | None, ...] = (None,)) -> int:
        return sum(len(self.graphs(depth)) for depth in depths)

    def cached(self, depths: tuple[int | None, ...] = (None,)) -> bool:
        """Whether the compile cache already holds every graph of these depths (nothing is created)."""
        return holds(self.key, [graph.name for depth in depths for graph in self.graphs(depth)])


class MissingGraph(RuntimeError):
    """A graph a load-only CompiledForward needs is not in the cache, or its package does not load."""


class CompiledForward:
    """model's forward, compiled (all graphs at construction): same arguments, same result within rounding.

    graph_set: what the graphs were made for (default: this model, as --compile builds it). compile_missing=False
    only loads: a graph the cache lacks raises MissingGraph (the model may then be one packed for eager serving,
    which must not be compiled). run_now=False: the graphs are not run at construction (`check` runs them
    later, on the thread that steps the engine, over a scratch cache)."""

    def __init__(self, model: LlamaForCausalLM, kv_cache: torch.Tensor, graph_set: GraphSet | None = None,
                 depths: tuple[int | None, ...] = (None,), compile_missing: bool = True, run_now: bool = True):
        self.model = model
        self.graph_set = graph_set or GraphSet.of(model, kv_cache.dtype)
        self.logits_compiled = self.graph_set.logits_compiled
        self.compile_missing = compile_missing
        self.cache = CompileCache(self.graph_set.key)
        self.runs: dict[Graph, Run] = {}
        self.loaded: set[Graph] = set()     # graphs whose package came from the cache
        self.num_compiled = 0               # graphs compiled by this engine
        for depth in depths:
            self.warm_up(kv_cache, depth, run_now)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                 num_layers: int | None = None) -> torch.Tensor:
        num_tokens = input_ids.shape[0]
        bucket = _bucket(num_tokens)
        run = self._run(Graph("forward", bucket, num_layers), kv_cache)
        if bucket is None:
            return run([input_ids, positions, kv_cache])[0]
        padding = (0, bucket - num_tokens)
        return run([F.pad(input_ids, padding), F.pad(positions, padding), kv_cache])[0][:num_tokens]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's compute_logits, compiled: rows padded to a bucket (none: to 1) or the dynamic graph."""
        if not self.logits_compiled:
            return self.model.compute_logits(hidden)
        num_rows = hidden.shape[0]
        bucket = _bucket(num_rows)
        run = self._run(Graph("logits", bucket), None)
        if bucket is None:
            return run([hidden])[0]
        return run([F.pad(hidden, (0, 0, 0, bucket - num_rows))])[0][:num_rows]

    @torch.inference_mode()
    def warm_up(self, kv_cache: torch.Tensor, num_layers: int | None = None, run: bool = True) -> None:
        """Make ready every graph of a forward through the first num_layers layers (None: all), from the cache
        or compiled (a line on stderr for each: it takes minutes), and run each once (unless not `run`):
        prefills written to the first slots (any sequence that later holds those blocks writes its own keys
        there before reading them). A cached graph that does not run is compiled again."""
        started, compiled_before = time.perf_counter(), self.num_compiled
        graphs = self.graph_set.graphs(num_layers)
        for index, graph in enumerate(graphs):
            progress = f" ({index + 1} of {len(graphs)})"
            try:
                self._ready(graph, kv_cache, progress)
                if run:
                    self._try(graph, kv_cache)
            except Exception as error:      # a cached package that loads but does not run
                if graph not in self.loaded or not self.compile_missing:
                    raise
                note(f"the cached graph {self.cache.path(graph.name)} does not run ({_first_line(error)}); "
                     f"compiling it again")
                self.cache.discard(graph.name)
                del self.runs[graph]
                self._ready(graph, kv_cache, progress)
                self._try(graph, kv_cache)
        compiled = self.num_compiled - compiled_before
        where = f"kept in {self.cache.directory}" if self.cache.kept else "not kept: SPECWISE_COMPILE_CACHE is off"
        verb = f"compiled {compiled} of {len(graphs)} graphs" if compiled else f"loaded {len(graphs)} compiled graphs"
        note(f"{verb} in {time.perf_counter() - started:.0f} s ({where})")

    @torch.inference_mode()
    def check(self, kv_cache: torch.Tensor) -> None:
        """Run every graph once over kv_cache (a scratch cache of DYNAMIC_WARM_UP slots or more: a runner's own
        may hold K/V of requests in flight); raises what a graph raises."""
        for graph in self.runs:
            self._try(graph, kv_cache)

    def _run(self, graph: Graph, kv_cache: torch.Tensor | None) -> Run:
        if graph not in self.runs:
            self._ready(graph, kv_cache)
        return self.runs[graph]

    def _ready(self, graph: Graph, kv_cache: torch.Tensor | None, progress: str = "") -> None:
        """Load graph's package from the cache, or compile it there (a corrupt package: again, with a note)."""
        path = self.cache.path(graph.name)
        if path.is_file():
            try:
                self.cache.verify(graph.name)
                self.runs[graph] = _load(path)
                self.loaded.add(graph)
                return
            except Exception as error:
                if not self.compile_missing:
                    raise MissingGraph(f"the cached graph {path} does not load ({_first_line(error)})") from error
                note(f"the cached graph {path} does not load ({_first_line(error)}); compiling it again")
                self.cache.discard(graph.name)
        if not self.compile_missing:
            raise MissingGraph(f"{graph.describe()} is not in the compile cache ({path})")
        self.loaded.discard(graph)
        self.num_compiled += 1
        note(f"compiling {graph.describe()}{progress}")
        module, example, dynamic_shapes = self._exportable(graph, kv_cache)
        try:
            path = self.cache.store(graph.name, lambda scratch: compile_graph(module, example, dynamic_shapes,
                                                                               graph.rows is not None, scratch))
        except Exception as error:
            if not _is_compile_failure(error):
                raise
            raise ConfigError(f"--compile: inductor could not compile the model ({_first_line(error)}). The usual "
                              f"cause is no working C++ compiler (it needs g++ or clang++ on PATH, or CXX=...); "
                              f"--no-compile runs the model without inductor") from error
        self.runs[graph] = _load(path)

    def _exportable(self, graph: Graph, kv_cache: torch.Tensor | None):
        """(module, example inputs, dynamic shapes) to export graph from."""
        rows = DYNAMIC_WARM_UP if graph.rows is None else graph.rows
        # more rows than the last bucket; the cache's slots are free too, so one package serves any cache size
        dynamic = torch.export.Dim("rows", min=BUCKETS[-1] + 1)
        if graph.kind == "logits":
            hidden = torch.zeros(rows, self.model.config.hidden_size, dtype=self.model.norm.weight.dtype)
            return _Logits(self.model), (hidden,), ({0: dynamic} if graph.rows is None else None,)
        slots = torch.export.Dim("slots")
        token_dims = {0: dynamic} if graph.rows is None else None
        example = (torch.zeros(rows, dtype=torch.long), torch.arange(rows), kv_cache)
        return _Forward(self.model, graph.num_layers), example, (token_dims, token_dims, {3: slots})

    def _try(self, graph: Graph, kv_cache: torch.Tensor) -> None:
        """Run graph once on a prefill of its example size written to the first slots."""
        rows = DYNAMIC_WARM_UP if graph.rows is None else graph.rows
        if graph.kind == "logits":
            self.runs[graph]([torch.zeros(rows, self.model.config.hidden_size, dtype=kv_cache.dtype)])
            return
        slots = torch.arange(rows, device=kv_cache.device)
        with step_metadata(AttentionMetadata(slots, [PrefillChunk(0, rows)], [])):
            self.runs[graph]([torch.zeros(rows, dtype=torch.long, device=kv_cache.device), slots, kv_cache])


def scratch_cache(kv_cache: torch.Tensor) -> torch.Tensor:
    """A KV cache shaped as kv_cache but of DYNAMIC_WARM_UP slots, for `check` (the graphs take any slot count)."""
    layers, pair, heads, _, head_dim = kv_cache.shape
    return torch.zeros(layers, pair, heads, DYNAMIC_WARM_UP, head_dim, dtype=kv_cache.dtype, device=kv_cache.device)


def compile_graph(module: torch.nn.Module, example: tuple, dynamic_shapes: tuple, autotune: bool,
                  path: str) -> None:
    """Export module at the example inputs and compile it with AOTInductor into a package at path. Freezing:
    the weights are constants, oneDNN's linears prepacked; autotune (a bucket's static graph): the matmuls are
    inductor's C++ GEMM template, the only choice, so nothing is benchmarked."""
    options = {"freezing": True}
    if autotune:
        options.update(max_autotune=True, max_autotune_gemm_backends="CPP")
    with torch.inference_mode(False), torch.no_grad():
        exported = torch.export.export(module, example, dynamic_shapes=dynamic_shapes, strict=False)
        torch._inductor.aoti_compile_and_package(exported, package_path=path, inductor_configs=options)


def _load(path: Path) -> Run:
    """The package's loader, built as `torch._inductor.aoti_load_package` builds it but without importing
    inductor (its Python side): five of the default model's graphs loaded in 2.1 s against 5.7-6.6 s.

    The loader unpacks the package into a directory of its own under the temp dir and removes it only when
    it is freed, which a process that ends by os._exit (the compile worker) or is killed never does: each
    such process left its graphs there (the default model's 8: 1.3 GB; the 2-core VM's /tmp held 608 such
    directories of the tests' tiny models after a day). The library it loaded stays mapped once its file is
    gone, so the directory is removed as soon as the graph is loaded (one load at a time: the files a load
    mapped are its own)."""
    with _LOADING:
        before = _mapped_files()
        loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
        for unpacked in {match[1] for name in _mapped_files() - before if (match := UNPACKED.match(name))}:
            shutil.rmtree(unpacked, ignore_errors=True)
    return loader.boxed_run


def _mapped_files() -> set[str]:
    """The files this process has mapped (Linux's /proc/self/maps: address, perms, offset, dev, inode, path);
    none where it has no such file (there the loader's own cleanup, when it is freed, is all there is)."""
    try:
        with open(PROC_MAPS, encoding="utf-8", errors="replace") as maps:
            return {fields[5].strip() for fields in (line.split(maxsplit=5) for line in maps) if len(fields) == 6}
    except OSError:
        return set()


def _is_compile_failure(error: Exception) -> bool:
    """An error from compiling (inductor is imported by then): C++ compiler missing or failing."""
    inductor = torch._inductor.exc
    return isinstance(error, (inductor.CppCompileError, inductor.InductorError, FileNotFoundError, PermissionError))


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _bucket(num_rows: int) -> int | None:
    """The smallest static graph's size that holds num_rows (0 rows: the 1-row graph); None above them all."""
    return next((size for size in BUCKETS if size >= max(num_rows, 1)), None)
