"""Does speculation pay on this machine? Speedup per workload category and drafter, ours and transformers'.

In one run, on the same prompts (token ids from our chat template), greedy:

  concurrency 1, per category (code editing with the code in the prompt, summarization of a
  given text, open-ended chat; more with --categories):
    ours          no speculation, ngram, layer_skip:L (each L of --layer-skip) and draft:PATH
                  (with --draft), each at every k of --ks: output tokens/s (prompt included in the
                  time, as a user sees it) and its speedup over no speculation; TPOT (decode only)
                  and its speedup; acceptance rate and mean acceptance length (docs/design.md
                  definitions, from the engine's own counters)
    transformers  `generate` plain, with prompt_lookup_num_tokens=k (its n-gram drafter) and with
                  assistant_early_exit=L (its layer-skip drafter, num_assistant_tokens=k constant)
                  when that works on this model: tokens/s, TPOT (from a streamer's timestamps) and
                  their speedups over its own plain generate
  concurrency 16 and 64 (--concurrency): requests submitted together, aggregate output tokens/s
    and mean TPOT with ngram against no speculation, the ratio showing how the gain compresses.

Every arm is warmed up first and measured back to back in the same process; the speedups are
ratios of figures taken side by side. Greedy output is identical with and without speculation
(lossless), so every arm of ours generates the same tokens. Nothing here is asserted by tests.

    python benchmarks/spec_speedup.py                          # default model, a few minutes on 2 cores
    python benchmarks/spec_speedup.py --per-category 5 --max-new-tokens 128 --json results.json
    python benchmarks/spec_speedup.py --draft path/to/small-model --layer-skip 22,26,28
    python benchmarks/spec_speedup.py --quick --max-new-tokens 16    # smoke run
"""

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hf_reference import load_hf  # noqa: E402
from specwise.engine.llm import LLM  # noqa: E402
from specwise.engine.spec_decode.metrics import SpecStats  # noqa: E402
from specwise.models.checkpoints.default_model import default_model_path  # noqa: E402
from specwise.sampling_params import SamplingParams  # noqa: E402

console = Console()
if not console.is_terminal:          # piped or redirected: do not squeeze the tables into 80 columns
    console = Console(width=200)

# used only if specwise.bench.inputs.suite is not there
FALLBACK_PROMPTS = {
    "code_editing": [[{"role": "user", "content": (
        "Rename `data` to `readings` everywhere in this function and return the whole function.\n\n"
        "```python\ndef average(data):\n    if not data:\n        return 0.0\n    total = 0.0\n    for value in data:\n"
        "        total += value\n    return total / len(data)\n```")}]],
    "summarization": [[{"role": "user", "content": (
        "Summarize the following text in three sentences.\n\nThe city council met on Tuesday evening to discuss "
        "the proposed network of protected bike lanes downtown. Supporters said the lanes would reduce injuries and "
        "encourage commuting by bike; shop owners worried about losing parking in front of their stores. After two "
        "hours of public comment, the council voted six to three to build the first two lanes next spring and to "
        "review parking in a year.")}]],
    "chat": [[{"role": "user", "content": "What are some good habits for staying focused while working from home?"}]],
}


@dataclass
class Request:
    request_id: str
    category: str
    token_ids: list[int]
    max_tokens: int


@dataclass
class Measured:
    tokens: int = 0
    seconds: float = 0.0
    tpots: list[float] = field(default_factory=list)
    spec: SpecStats = field(default_factory=SpecStats)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("nan")

    @property
    def mean_tpot_ms(self) -> float | None:
        return 1000 * sum(self.tpots) / len(self.tpots) if self.tpots else None

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "seconds": self.seconds, "tokens_per_s": self.tokens_per_s,
                "mean_tpot_ms": self.mean_tpot_ms, "spec": self.spec.to_dict()}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="target: HF directory or GGUF file (default: embedded default)")
    parser.add_argument("--categories", default="code_editing,summarization,chat",
                        help="suite categories (default code_editing,summarization,chat)")
    parser.add_argument("--per-category", type=int, default=2, help="prompts per category (default 2)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="cap on tokens per request (default 64)")
    parser.add_argument("--ks", default="2,4,8", help="draft lengths k (default 2,4,8)")
    parser.add_argument("--layer-skip", default="15,26",
                        help="layer_skip L values (default 15,26; SmolLM2-135M's first 8 layers draft nothing "
                             "its 30 accept)")
    parser.add_argument("--draft", default=None, help="draft model path for draft:PATH arms")
    parser.add_argument("--concurrency", default="16,64", help="concurrency levels for the ngram ratio (default 16,64)")
    parser.add_argument("--concurrency-ks", default="4", help="ngram k at those levels (default 4)")
    parser.add_argument("--dtype", default="float32", help="compute dtype of both engines (default float32)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--no-hf", action="store_true", help="skip transformers")
    parser.add_argument("--no-early-exit", action="store_true", help="skip transformers' assistant_early_exit")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 prompt per category, k=4, one L, concurrency 16 only")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    args.category_list = [name.strip() for name in args.categories.split(",") if name.strip()]
    args.k_list = [int(k) for k in args.ks.split(",") if k.strip()]
    args.layer_list = [int(layers) for layers in args.layer_skip.split(",") if layers.strip()]
    args.concurrency_list = [int(c) for c in args.concurrency.split(",") if c.strip()]
    args.concurrency_k_list = [int(k) for k in args.concurrency_ks.split(",") if k.strip()]
    if args.quick:
        args.per_category = 1
        args.k_list = [4] if 4 in args.k_list or not args.k_list else args.k_list[:1]
        args.layer_list = args.layer_list[:1]
        args.concurrency_list = [c for c in args.concurrency_list if c <= 16][:1]
        args.concurrency_k_list = args.concurrency_k_list[:1]
    return args


# ----------------------------------------------------------------------------- workloads


def load_requests(tokenizer, categories: list[str], per_category: int, max_new_tokens: int) -> list[Request]:
    try:
        from specwise.bench.inputs.suite import load_suite
    except ImportError:
        load_suite = None
    requests = []
    if load_suite is not None:
        for item in load_suite(categories, per_category=per_category):
            ids = tokenizer.apply_chat_template(item.messages) if item.messages else tokenizer.encode(item.prompt)
            requests.append(Request(item.request_id, item.category, ids, min(item.max_tokens, max_new_tokens)))
        return requests
    for category in categories:
        for index, messages in enumerate(FALLBACK_PROMPTS[category][:per_category]):
            requests.append(Request(f"{category}-{index}", category, tokenizer.apply_chat_template(messages),
                                    max_new_tokens))
    return requests


# ----------------------------------------------------------------------------- our engine


def arms_ours(args) -> list[tuple[str, str | None, int]]:
    """(label, --speculative text, k)."""
    arms = [("off", None, 0)]
    arms += [(f"ngram k={k}", "ngram", k) for k in args.k_list]
    arms += [(f"layer_skip:{layers} k={k}", f"layer_skip:{layers}", k) for layers in args.layer_list
             for k in args.k_list]
    if args.draft:
        arms += [(f"draft k={k}", f"draft:{args.draft}", k) for k in args.k_list]
    return arms


def run_batch(llm: LLM, requests: list[Request]) -> tuple[Measured, dict[str, list[int]]]:
    """Submit all requests at once, step to the end; per-request TTFT/TPOT from step timestamps."""
    engine = llm.engine
    started = time.perf_counter()
    ids = {}
    for request in requests:
        params = SamplingParams(temperature=0, max_tokens=request.max_tokens)
        ids[engine.add_request(request.token_ids, params)] = request
    first_token, finals = {}, {}
    while engine.has_unfinished():
        outputs = engine.step()
        now = time.perf_counter()
        for output in outputs:
            first_token.setdefault(output.request_id, now)
            if output.finished:
                finals[output.request_id] = (output, now)
    ended = time.perf_counter()
    measured = Measured(seconds=ended - started)
    tokens_by_request = {}
    for request_id, (output, finished_at) in finals.items():
        count = len(output.output_token_ids)
        measured.tokens += count
        measured.spec = measured.spec.merge(output.spec)
        if count > 1:
            measured.tpots.append((finished_at - first_token[request_id]) / (count - 1))
        tokens_by_request[ids[request_id].request_id] = output.output_token_ids
    return measured, tokens_by_request


def bench_ours_concurrency_one(llm: LLM, requests: list[Request], arms) -> dict:
    """{arm label: {category: Measured}}, each request alone (concurrency 1)."""
    results, outputs = {}, {}
    for label, speculative, k in arms:
        llm.engine.set_speculative(speculative, max(k, 1))
        run_batch(llm, [warm_up(requests[0])])
        per_category = {}
        for request in requests:
            measured, tokens = run_batch(llm, [request])
            total = per_category.setdefault(request.category, Measured())
            total.tokens += measured.tokens
            total.seconds += measured.seconds
            total.tpots += measured.tpots
            total.spec = total.spec.merge(measured.spec)
            outputs.setdefault(request.request_id, {})[label] = tokens[request.request_id]
        results[label] = per_category
        console.print(f"  ours {label}: " + ", ".join(f"{category} {m.tokens_per_s:.1f} tok/s"
                                                       for category, m in per_category.items()))
    mismatched = [request_id for request_id, by_arm in outputs.items() if len({tuple(v) for v in by_arm.values()}) > 1]
    if mismatched:
        console.print(f"[red]greedy outputs differ between arms for {mismatched} (expected identical: lossless)[/]")
    return results


def bench_ours_concurrency(llm: LLM, requests: list[Request], levels: list[int], ks: list[int]) -> dict:
    """{concurrency: {arm: Measured}} with `concurrency` requests in flight together."""
    results = {}
    for concurrency in levels:
        batch = [requests[index % len(requests)] for index in range(concurrency)]
        results[concurrency] = {}
        for label, speculative, k in [("off", None, 0)] + [(f"ngram k={k}", "ngram", k) for k in ks]:
            llm.engine.set_speculative(speculative, max(k, 1))
            run_batch(llm, [warm_up(request) for request in batch[:4]])
            measured, _ = run_batch(llm, batch)
            results[concurrency][label] = measured
            console.print(f"  ours concurrency {concurrency} {label}: {measured.tokens_per_s:.1f} tok/s")
    return results


def warm_up(request: Request) -> Request:
    return Request("warm-up", request.category, request.token_ids, min(4, request.max_tokens))


# ----------------------------------------------------------------------------- transformers


def arms_hf(args) -> list[tuple[str, dict]]:
    arms = [("hf plain", {})]
    arms += [(f"hf prompt_lookup k={k}", {"prompt_lookup_num_tokens": k}) for k in args.k_list]
    if not args.no_early_exit:
        arms += [(f"hf early_exit:{layers} k={k}", {"assistant_early_exit": layers, "num_assistant_tokens": k,
                                                    "num_assistant_tokens_schedule": "constant"})
                 for layers in args.layer_list for k in args.k_list]
    return arms


class TimingStreamer:
    """A transformers streamer that only notes when each chunk arrives (the first put() is the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def hf_generate(model, request: Request, extra: dict) -> tuple[int, float, float | None]:
    """(new tokens, seconds, TPOT seconds or None) of one greedy generate."""
    input_ids = torch.tensor([request.token_ids])
    streamer = TimingStreamer()
    started = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                max_new_tokens=request.max_tokens, pad_token_id=model.config.eos_token_id or 0,
                                streamer=streamer, **extra)
    ended = time.perf_counter()
    tokens = output.shape[1] - input_ids.shape[1]
    tpot = (ended - streamer.times[1]) / (tokens - 1) if tokens > 1 and len(streamer.times) > 1 else None
    return tokens, ended - started, tpot


def bench_hf(model, requests: list[Request], arms) -> dict:
    results = {}
    for label, extra in arms:
        try:
            hf_generate(model, warm_up(requests[0]), extra)
        except Exception as error:      # noqa: BLE001 - an arm this transformers/model cannot run
            console.print(f"  {label}: [yellow]not available here ({type(error).__name__}: {error})[/]")
            results[label] = None
            continue
        per_category = {}
        for request in requests:
            tokens, seconds, tpot = hf_generate(model, request, extra)
            total = per_category.setdefault(request.category, Measured())
            total.tokens += tokens
            total.seconds += seconds
            if tpot is not None:
                total.tpots.append(tpot)
        results[label] = per_category
        console.print(f"  {label}: " + ", ".join(f"{category} {m.tokens_per_s:.1f} tok/s"
                                                  for category, m in per_category.items()))
    return results


# ----------------------------------------------------------------------------- report


def fmt(value, spec=".2f") -> str:
    return "-" if value is None else format(value, spec)


def ratio(numerator, denominator) -> float | None:
    return numerator / denominator if numerator and denominator else None


def print_report(args, categories, ours, hf, concurrency) -> None:
    table = Table(title="Concurrency 1: ours (tokens/s, speedup over no speculation, acceptance)")
    for column in ("category", "arm", "tok/s", "speedup", "TPOT ms", "TPOT speedup", "acceptance rate",
                   "mean acc. length"):
        table.add_column(column, justify="right" if column not in ("category", "arm") else "left")
    for category in categories:
        base = ours["off"][category]
        for label, per_category in ours.items():
            measured = per_category[category]
            table.add_row(category, label, fmt(measured.tokens_per_s, ".1f"),
                          fmt(measured.tokens_per_s / base.tokens_per_s), fmt(measured.mean_tpot_ms, ".0f"),
                          fmt(ratio(base.mean_tpot_ms, measured.mean_tpot_ms)),
                          fmt(measured.spec.acceptance_rate), fmt(measured.spec.mean_acceptance_length))
        table.add_section()
    console.print(table)
    if hf:
        table = Table(title="Concurrency 1: transformers generate (tokens/s, speedup over its plain generate)")
        for column in ("category", "arm", "tok/s", "speedup", "TPOT ms", "TPOT speedup"):
            table.add_column(column, justify="right" if column not in ("category", "arm") else "left")
        for category in categories:
            base = hf["hf plain"][category] if hf.get("hf plain") else None
            for label, per_category in hf.items():
                if per_category is None:
                    table.add_row(category, label, "n/a", "n/a", "n/a", "n/a")
                    continue
                measured = per_category[category]
                table.add_row(category, label, fmt(measured.tokens_per_s, ".1f"),
                              fmt(ratio(measured.tokens_per_s, base and base.tokens_per_s)),
                              fmt(measured.mean_tpot_ms, ".0f"),
                              fmt(ratio(base and base.mean_tpot_ms, measured.mean_tpot_ms)))
            table.add_section()
        console.print(table)
        print_side_by_side(args, categories, ours, hf)
    if concurrency:
        table = Table(title="Concurrency > 1: ngram against no speculation (aggregate output tokens/s)")
        for column in ("concurrency", "arm", "tok/s", "ratio vs off", "mean TPOT ms", "acceptance rate",
                       "mean acc. length"):
            table.add_column(column, justify="right" if column != "arm" else "left")
        for level, arms in concurrency.items():
            base = arms["off"].tokens_per_s
            for label, measured in arms.items():
                table.add_row(str(level), label, fmt(measured.tokens_per_s, ".1f"),
                              fmt(measured.tokens_per_s / base), fmt(measured.mean_tpot_ms, ".0f"),
                              fmt(measured.spec.acceptance_rate), fmt(measured.spec.mean_acceptance_length))
            table.add_section()
        console.print(table)


def print_side_by_side(args, categories, ours, hf) -> None:
    """Speedup ratios, ours next to the matching transformers drafter (same k, same L)."""
    table = Table(title="Speedup over each engine's own plain decoding, side by side (concurrency 1)")
    table.add_column("category")
    pairs = [(f"ngram k={k}", f"hf prompt_lookup k={k}") for k in args.k_list]
    pairs += [(f"layer_skip:{layers} k={k}", f"hf early_exit:{layers} k={k}") for layers in args.layer_list
              for k in args.k_list]
    for ours_label, hf_label in pairs:
        table.add_column(f"{ours_label}\nours | hf", justify="right")
    for category in categories:
        cells = []
        for ours_label, hf_label in pairs:
            ours_ratio = ours[ours_label][category].tokens_per_s / ours["off"][category].tokens_per_s
            hf_arm = hf.get(hf_label)
            hf_ratio = (hf_arm[category].tokens_per_s / hf["hf plain"][category].tokens_per_s
                        if hf_arm and hf.get("hf plain") else None)
            cells.append(f"{ours_ratio:.2f} | {fmt(hf_ratio)}")
        table.add_row(category, *cells)
    console.print(table)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_path = Path(args.model) if args.model else default_model_path()
    console.print(f"[bold]machine[/]: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                  f"torch {torch.__version__} ({torch.get_num_threads()} threads); model {model_path}, {args.dtype}")
    llm = LLM(model=str(model_path), dtype=args.dtype, max_model_len=2048,
              max_num_seqs=max([1] + args.concurrency_list))
    requests = load_requests(llm.tokenizer, args.category_list, args.per_category, args.max_new_tokens)
    categories = list(dict.fromkeys(request.category for request in requests))
    console.print(f"{len(requests)} requests: " + ", ".join(
        f"{category} x{sum(r.category == category for r in requests)}" for category in categories)
        + f"; up to {args.max_new_tokens} new tokens, greedy")
    console.print("[bold]ours, concurrency 1[/]")
    ours = bench_ours_concurrency_one(llm, requests, arms_ours(args))
    concurrency = {}
    if args.concurrency_list:
        console.print("[bold]ours, concurrency > 1[/]")
        concurrency = bench_ours_concurrency(llm, requests, args.concurrency_list, args.concurrency_k_list)
    hf = {}
    if not args.no_hf:
        del llm
        console.print("[bold]transformers, concurrency 1[/]")
        hf = bench_hf(load_hf(model_path, getattr(torch, args.dtype)), requests, arms_hf(args))
    print_report(args, categories, ours, hf, concurrency)
    if args.json:
        document = {
            "model": str(model_path), "dtype": args.dtype, "max_new_tokens": args.max_new_tokens,
            "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                        "torch": torch.__version__, "threads": torch.get_num_threads()},
            "requests": [{"id": r.request_id, "category": r.category, "prompt_tokens": len(r.token_ids),
                          "max_tokens": r.max_tokens} for r in requests],
            "ours": {label: {c: m.to_dict() for c, m in per.items()} for label, per in ours.items()},
            "transformers": {label: None if per is None else {c: m.to_dict() for c, m in per.items()}
                             for label, per in hf.items()},
            "concurrency": {str(level): {label: m.to_dict() for label, m in arms.items()}
                            for level, arms in concurrency.items()},
        }
        Path(args.json).write_text(json.dumps(document, indent=2))
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
