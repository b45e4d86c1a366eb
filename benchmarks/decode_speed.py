"""Decode speed of our engine next to Hugging Face transformers `generate`, on the same prompts.

For each dtype and batch size: greedy decoding of a fixed number of new tokens (EOS
ignored) from the same prompt token ids, warm-up excluded, both arms in the same run:

  decode tok/s     tokens after the first one / time after the first one (prefill excluded);
                   at batch 1 this is 1 / TPOT. transformers: (T(N tokens) - T(1 token)) timed separately
  aggregate tok/s  all generated tokens / wall time, prefill included
  weight GB/s      weight bytes x decode steps/s: the weight traffic decoding needs (each step reads
                   every weight once), against the machine's memory bandwidth measured here
                   (large-tensor sum = read bandwidth, copy = read + write)
  roofline         weight GB/s / measured read bandwidth (fp32 at batch 1 is the memory-bound case)

Timings are ratios measured side by side on one machine; the absolute figures belong to
the machine printed at the top. Nothing here is asserted by tests.

    python benchmarks/decode_speed.py                       # default model, every weight format, batches 1 4 16 64
    python benchmarks/decode_speed.py --dtype bfloat16+int4 --max-new-tokens 128
    python benchmarks/decode_speed.py --quick --max-new-tokens 16   # smoke run
    python benchmarks/decode_speed.py --dtype bfloat16 --compile    # ours compiled by inductor
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hf_reference import load_hf  # noqa: E402
from specwise.engine.llm import LLM  # noqa: E402
from specwise.models.checkpoints.default_model import default_model_path  # noqa: E402
from specwise.models.quantize import Int4Linear, Int8Linear, OneDNNLinear  # noqa: E402
from specwise.sampling_params import SamplingParams  # noqa: E402

TEXTS = [
    "The history of the printing press begins in the fifteenth century, when movable type changed how "
    "books were made, sold and read across Europe, and with them how ideas travelled.",
    "def merge_sorted(left, right):\n    result = []\n    i = j = 0\n    while i < len(left) and j < len(right):\n"
    "        if left[i] <= right[j]:\n            result.append(left[i])\n",
    "Dear team, thank you for the quick turnaround on the quarterly report. Before we send it to the board, "
    "could you double-check the revenue figures in section three?",
    "Photosynthesis converts light energy into chemical energy. In the light-dependent reactions, water is "
    "split and oxygen is released, while ATP and NADPH are produced.",
]
console = Console()
if not console.is_terminal:          # piped or redirected: do not squeeze the tables into 80 columns
    console = Console(width=200)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="HF directory or GGUF file (default: the embedded default model)")
    parser.add_argument("--dtype", default="float32,bfloat16,bfloat16+int8,bfloat16+int4",
                        help="comma list of weight formats: float32, bfloat16, bfloat16+int8, bfloat16+int4 "
                             "(compute dtype + weight-only quantization; transformers runs the compute dtype)")
    parser.add_argument("--batch-sizes", default="1,4,16,64", help="comma list (default 1,4,16,64)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens generated per sequence (default 32)")
    parser.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per sequence (default 32)")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per point, best kept (default 1)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--bandwidth-mb", type=int, default=512, help="buffer size of the bandwidth probe (MiB)")
    parser.add_argument("--no-hf", action="store_true", help="skip transformers")
    parser.add_argument("--compile", action="store_true",
                        help="ours with --compile (inductor, models/compile/graphs.py)")
    parser.add_argument("--quick", action="store_true", help="smoke run: batches 1,4 and one dtype")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    args.dtypes = [name.strip() for name in args.dtype.split(",") if name.strip()]
    args.batches = [int(size) for size in args.batch_sizes.split(",")]
    if args.quick:
        args.batches = [size for size in args.batches if size <= 4] or [1]
        args.dtypes = args.dtypes[:1]
        args.bandwidth_mb = min(args.bandwidth_mb, 256)
    return args


# ----------------------------------------------------------------------------- machine


def measure_bandwidth(megabytes: int, repeats: int = 5) -> dict:
    """Best-of-N read (sum) and copy bandwidth of a buffer far larger than the caches, GB/s (1e9)."""
    numel = megabytes * 2**20 // 4
    source = torch.ones(numel, dtype=torch.float32)
    target = torch.empty_like(source)
    nbytes = numel * 4
    read, copy = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        source.sum()
        read.append(nbytes / (time.perf_counter() - started) / 1e9)
        started = time.perf_counter()
        target.copy_(source)
        copy.append(2 * nbytes / (time.perf_counter() - started) / 1e9)
    return {"read_gb_s": max(read), "copy_gb_s": max(copy), "buffer_mib": megabytes}


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads()}


def step_weight_bytes(model: torch.nn.Module) -> int:
    """Weight bytes one decode step reads: every linear layer (LM head included) in its packed
    format; the embedding table is read a row per token (counted only when it is the LM head)."""
    total = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            total += module.weight.numel() * module.weight.element_size()
        elif isinstance(module, OneDNNLinear):
            total += module.weight_bytes
        elif isinstance(module, (Int8Linear, Int4Linear)):
            total += sum(buffer.numel() * buffer.element_size() for buffer in module.buffers())
    return total


# ----------------------------------------------------------------------------- prompts


def prompt_token_ids(tokenizer, batch_size: int, length: int) -> list[list[int]]:
    """batch_size distinct prompts of exactly `length` tokens, cut from TEXTS (BOS first when the model wants one)."""
    stream = []
    for text in TEXTS:
        stream.extend(tokenizer.encode(" " + text, add_special_tokens=False))
    prompts = []
    for row in range(batch_size):
        start = (row * 7) % len(stream)
        ids = [stream[(start + offset) % len(stream)] for offset in range(length)]
        if tokenizer.add_bos and tokenizer.bos_token_id is not None:
            ids[0] = tokenizer.bos_token_id
        prompts.append(ids)
    return prompts


# ----------------------------------------------------------------------------- our engine


def run_ours(llm: LLM, prompts: list[list[int]], new_tokens: int) -> dict:
    """One batch through add_request/step; times the prefill step(s) apart from the decode steps."""
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    started = time.perf_counter()
    for ids in prompts:
        engine.add_request(ids, params)
    produced = {}
    first_done = None
    while engine.has_unfinished():
        for output in engine.step():
            produced[output.request_id] = len(output.output_token_ids)
        if first_done is None and len(produced) == len(prompts):
            first_done = time.perf_counter()
    ended = time.perf_counter()
    total = sum(produced.values())
    assert total == len(prompts) * new_tokens, (total, len(prompts), new_tokens)
    return timing(len(prompts), new_tokens, ended - started, ended - first_done)


def timing(batch_size: int, new_tokens: int, wall: float, decode_seconds: float) -> dict:
    decode_steps = new_tokens - 1
    return {"wall_s": wall, "decode_s": decode_seconds,
            "aggregate_tok_s": batch_size * new_tokens / wall,
            "decode_tok_s": batch_size * decode_steps / decode_seconds if decode_seconds > 0 else float("nan"),
            "decode_steps_s": decode_steps / decode_seconds if decode_seconds > 0 else float("nan")}


# ----------------------------------------------------------------------------- transformers


def hf_generate(model, prompts: list[list[int]], new_tokens: int) -> float:
    input_ids = torch.tensor(prompts)
    started = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                pad_token_id=model.config.eos_token_id or 0)
    seconds = time.perf_counter() - started
    assert output.shape[1] - input_ids.shape[1] == new_tokens
    return seconds


def run_hf(model, prompts: list[list[int]], new_tokens: int) -> dict:
    """generate(N) and generate(1) timed apart: decode time = the difference."""
    prefill = hf_generate(model, prompts, 1)
    wall = hf_generate(model, prompts, new_tokens)
    return timing(len(prompts), new_tokens, wall, max(wall - prefill, 1e-9))


# ----------------------------------------------------------------------------- main


def best(runs: list[dict]) -> dict:
    return max(runs, key=lambda run: run["aggregate_tok_s"])


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_path = Path(args.model) if args.model else default_model_path()
    info = machine()
    console.print(f"[bold]machine[/]: {info['processor']}, {info['cpus']} CPUs, torch {info['torch']} "
                  f"({info['threads']} threads), {info['platform']}")
    bandwidth = measure_bandwidth(args.bandwidth_mb)
    console.print(f"[bold]memory bandwidth[/] ({bandwidth['buffer_mib']} MiB buffer): read {bandwidth['read_gb_s']:.1f} "
                  f"GB/s, copy {bandwidth['copy_gb_s']:.1f} GB/s")
    console.print(f"[bold]model[/]: {model_path}; prompts {args.prompt_len} tokens, {args.max_new_tokens} new tokens, "
                  f"greedy, EOS ignored")
    rows = []
    for dtype_name in args.dtypes:
        compute, _, quantization = dtype_name.partition("+")
        dtype = getattr(torch, compute)
        max_len = args.prompt_len + args.max_new_tokens + 8
        llm = LLM(model=str(model_path), dtype=compute, quantization=quantization or "none", compile=args.compile,
                  max_num_seqs=max(args.batches), max_model_len=max_len,
                  max_num_batched_tokens=max(max(args.batches) * args.prompt_len, max_len))
        ours_bytes = step_weight_bytes(llm.engine.model)
        hf_model = None if args.no_hf else load_hf(model_path, dtype)
        hf_bytes = step_weight_bytes(hf_model) if hf_model is not None else None
        for batch_size in args.batches:
            prompts = prompt_token_ids(llm.tokenizer, batch_size, args.prompt_len)
            run_ours(llm, prompts, min(4, args.max_new_tokens))                    # warm-up
            ours = best([run_ours(llm, prompts, args.max_new_tokens) for _ in range(args.repeats)])
            row = {"dtype": dtype_name, "batch": batch_size, "ours": ours, "ours_model_bytes": ours_bytes}
            if hf_model is not None:
                hf_generate(hf_model, prompts, min(4, args.max_new_tokens))         # warm-up
                row["hf"] = best([run_hf(hf_model, prompts, args.max_new_tokens) for _ in range(args.repeats)])
                row["hf_model_bytes"] = hf_bytes
            for arm, size in (("ours", ours_bytes), ("hf", hf_bytes)):
                if arm in row:
                    row[arm]["weight_gb_s"] = size * row[arm]["decode_steps_s"] / 1e9
                    row[arm]["roofline"] = row[arm]["weight_gb_s"] / bandwidth["read_gb_s"]
            rows.append(row)
            console.print(f"  {dtype_name} batch {batch_size}: ours {ours['decode_tok_s']:.1f} decode tok/s"
                          + (f", transformers {row['hf']['decode_tok_s']:.1f}" if "hf" in row else ""))
        del llm, hf_model
    print_table(rows, bandwidth)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "bandwidth": bandwidth, "model": str(model_path),
                                               "prompt_len": args.prompt_len, "max_new_tokens": args.max_new_tokens,
                                               "rows": rows}, indent=2))
        console.print(f"wrote {args.json}")
    return 0


def print_table(rows: list[dict], bandwidth: dict) -> None:
    table = Table(title="Decode speed: specwise engine vs transformers generate (same prompts, greedy)")
    for column in ("dtype", "batch", "decode tok/s\nours", "\nhf", "\nours/hf",
                   "aggregate tok/s\nours", "\nhf", "\nours/hf",
                   "weight GB/s\nours", "\nhf", "roofline\nours", "\nhf"):
        table.add_column(column, justify="right")
    fmt = lambda value, spec=".1f": "-" if value is None else format(value, spec)
    for row in rows:
        ours, hf = row["ours"], row.get("hf")
        get = lambda arm, key: None if arm is None else arm[key]
        ratio = lambda key: None if hf is None else ours[key] / hf[key]
        table.add_row(row["dtype"], str(row["batch"]),
                      fmt(ours["decode_tok_s"]), fmt(get(hf, "decode_tok_s")), fmt(ratio("decode_tok_s"), ".2f"),
                      fmt(ours["aggregate_tok_s"]), fmt(get(hf, "aggregate_tok_s")),
                      fmt(ratio("aggregate_tok_s"), ".2f"),
                      fmt(ours["weight_gb_s"]), fmt(get(hf, "weight_gb_s")),
                      fmt(ours["roofline"], ".0%"), fmt(get(hf, "roofline"), ".0%"))
    console.print(table)
    console.print(f"roofline = model bytes x decode steps/s / measured read bandwidth ({bandwidth['read_gb_s']:.1f} GB/s); "
                  f"it is meaningful at batch 1, where decoding is bound by reading the weights.")


if __name__ == "__main__":
    sys.exit(main())
