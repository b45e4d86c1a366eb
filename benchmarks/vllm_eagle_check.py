"""An exported EAGLE (or EAGLE-3) head served by vLLM for CPU: is its greedy output the target's own, and
does it accept what ours accepts?

    python benchmarks/vllm_eagle_check.py                                  # the shipped head, 2 prompts/category
    python benchmarks/vllm_eagle_check.py --drafter DIR --per-category 3 --max-tokens 96

1. Exports the drafter (default: the EAGLE head shipped for SmolLM2-135M) with `specwise export-drafter
   --format vllm` into OUT/exported.
2. Ours: the same suite prompts through specwise's engine with `--speculative eagle:DRAFTER`, greedy, static
   k, one request at a time; acceptance per category from the engine's counters. When the drafter has a
   draft vocabulary (which the export expands), again with a copy drafting over the whole vocabulary:
   the drafts vLLM should reproduce.
3. vLLM without speculation, then with `--speculative-config {"method": "eagle", "model": OUT/exported,
   "num_speculative_tokens": k}` (own venv, benchmarks/README.md), one server at a time on 127.0.0.1,
   the same chat requests one at a time; vLLM's acceptance per category from its /metrics counters
   (vllm:spec_decode_*) scraped before and after each category.
4. Prints per category: mean acceptance length and acceptance rate, ours and vLLM's, their relative
   difference, and how many vLLM outputs with EAGLE equal vLLM's without. Writes OUT/check.json.

Both engines compute in --dtype (default float32: in bf16 a batch shape change alone can flip a near-tie,
docs/design.md). Figures are printed, never asserted (tests/test_vllm_export.py asserts the output).
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from specwise.bench.inputs.suite import CATEGORIES, load_suite  # noqa: E402
from specwise.engine.llm import LLM  # noqa: E402
from specwise.engine.spec_decode.metrics import SpecStats  # noqa: E402
from specwise.models.checkpoints.loader import load_checkpoint  # noqa: E402
from specwise.models.export.drafter_export import export_drafter  # noqa: E402
from specwise.models.export.export_formats import VLLM_METHODS  # noqa: E402
from specwise.models.heads.builtin import find_builtin_head  # noqa: E402
from specwise.monitor.exposition import parse_snapshot  # noqa: E402
from specwise.sampling_params import SamplingParams  # noqa: E402
from vllm_process import VllmServer  # noqa: E402

DEFAULT_MODEL = Path.home() / ".cache/specwise/smollm2-135m-instruct-hf"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL),
                        help="target as an HF directory (benchmarks/export_hf.py)")
    parser.add_argument("--drafter", default=None, help="EAGLE or EAGLE-3 drafter directory (default: the shipped "
                                                         "EAGLE head)")
    parser.add_argument("--categories", default=",".join(CATEGORIES))
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of our engine (vLLM for CPU computes "
                                                                "on all cores but one: 1 on 2 cores)")
    parser.add_argument("--vllm-args", default="--enforce-eager",
                        help="more vLLM flags for both servers (default --enforce-eager: no minutes-long compile at "
                             "each start; acceptance and greedy output are what is checked, not speed)")
    parser.add_argument("--out", default=str(ROOT / "specwise-results" /
                                             f"vllm-eagle-{time.strftime('%Y%m%d-%H%M%S')}"))
    return parser.parse_args(argv)


def ours(args, drafter: Path, requests_by_category: dict) -> dict:
    torch.set_num_threads(args.threads)
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=2048, speculative_policy="static")
    kind = json.loads((drafter / "drafter.json").read_text())["kind"]        # eagle or eagle3
    llm.engine.set_speculative(f"{kind}:{drafter}", args.k)
    results = {}
    for category, requests in requests_by_category.items():
        llm.engine.stats = SpecStats()
        texts = []
        for request in requests:
            ids = llm.tokenizer.apply_chat_template(request.messages)
            output = llm.generate(ids, SamplingParams(temperature=0, max_tokens=args.max_tokens))[0]
            texts.append(output.text)
        results[category] = {"stats": llm.engine.stats, "texts": texts}
        print(f"  ours {category}: mean acceptance length {llm.engine.stats.mean_acceptance_length:.3f}",
              file=sys.stderr, flush=True)
    return results


def without_draft_vocab(drafter: Path, out: Path) -> Path | None:
    """A copy of the drafter that drafts over the whole vocabulary, as its vLLM export does; None when it
    already does."""
    config = json.loads((drafter / "drafter.json").read_text())
    if config.get("draft_vocab") is None:
        return None
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(drafter, out)
    (out / "drafter.json").write_text(json.dumps({**config, "draft_vocab": None}, indent=2))
    return out


def vllm_texts(server: VllmServer, requests_by_category: dict, max_tokens: int, scrape: bool) -> dict:
    results = {}
    for category, requests in requests_by_category.items():
        before = server.metrics() if scrape else None
        texts = [server.complete(request.messages, max_tokens) for request in requests]
        entry = {"texts": texts}
        if scrape:
            start, end = (parse_snapshot(text, 0.0, "vllm").acceptance for text in (before, server.metrics()))
            positions = [round(a - b) for a, b in zip(end.accepted_per_position or [],
                                                      (start.accepted_per_position or []) + [0] * 64)]
            entry["stats"] = SpecStats(drafts=round(end.drafts - start.drafts),
                                       draft_tokens=round(end.draft_tokens - start.draft_tokens),
                                       accepted_tokens=round(end.accepted_tokens - start.accepted_tokens),
                                       accepted_per_position=positions)
            print(f"  vllm {category}: mean acceptance length {entry['stats'].mean_acceptance_length:.3f}",
                  file=sys.stderr, flush=True)
        results[category] = entry
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = load_checkpoint(args.model)
    drafter = Path(args.drafter) if args.drafter else find_builtin_head("eagle", target.config, target.tokenizer)
    exported = out / "exported"
    shutil.rmtree(exported, ignore_errors=True)
    export = export_drafter(drafter, "vllm", exported, target)
    print(f"exported {drafter} -> {exported}; {'; '.join(export.notes) or 'no conversion'}", flush=True)
    categories = [name.strip() for name in args.categories.split(",") if name.strip()]
    requests = {category: [r for r in load_suite([category], per_category=args.per_category) if r.messages]
                for category in categories}

    mine = ours(args, drafter, requests)
    kind = json.loads((drafter / "drafter.json").read_text())["kind"]
    # vLLM's EAGLE path drafts over the whole vocabulary; its EAGLE-3 path keeps the draft vocabulary
    full_vocab = without_draft_vocab(drafter, out / "drafter-full-vocab") if kind == "eagle" else None
    same_drafts = ours(args, full_vocab, requests) if full_vocab else mine
    extra = args.vllm_args.split()
    with VllmServer(args.model, extra, out / "vllm-off.log", dtype=args.dtype) as server:
        server.complete([{"role": "user", "content": "Hello"}], 4)                     # warm-up
        plain = vllm_texts(server, requests, args.max_tokens, scrape=False)
    spec = json.dumps({"method": VLLM_METHODS[kind], "model": str(exported), "num_speculative_tokens": args.k})
    with VllmServer(args.model, [*extra, "--speculative-config", spec], out / "vllm-eagle.log",
                    dtype=args.dtype) as server:
        eagle = vllm_texts(server, requests, args.max_tokens, scrape=True)

    print(f"\nvLLM 0.32.0 CPU vs specwise, {args.dtype}, greedy, k = {args.k}, {args.per_category} suite prompts per "
          f"category, up to {args.max_tokens} tokens, one request at a time")
    print(f"{'category':<14} {'ours MAL':>9} {'full voc.':>9} {'vLLM MAL':>9} {'diff':>7} {'ours rate':>9} "
          f"{'full voc.':>9} {'vLLM rate':>9} {'drafts f/v':>11} {'vLLM eagle = vLLM off':>22} {'ours = vLLM off':>16}")
    report = {"settings": vars(args), "exported": str(exported), "notes": export.notes, "categories": {}}
    for category in categories:
        o, f, v = mine[category]["stats"], same_drafts[category]["stats"], eagle[category]["stats"]
        same = sum(a == b for a, b in zip(eagle[category]["texts"], plain[category]["texts"]))
        ours_same = sum(a == b for a, b in zip(mine[category]["texts"], plain[category]["texts"]))
        n = len(requests[category])
        diff = v.mean_acceptance_length / f.mean_acceptance_length - 1 if f.drafts and v.drafts else float("nan")
        print(f"{category:<14} {o.mean_acceptance_length:>9.3f} {f.mean_acceptance_length:>9.3f} "
              f"{v.mean_acceptance_length:>9.3f} {diff:>+7.1%} {o.acceptance_rate:>9.3f} {f.acceptance_rate:>9.3f} "
              f"{v.acceptance_rate:>9.3f} {f'{f.drafts}/{v.drafts}':>11} {f'{same}/{n}':>22} {f'{ours_same}/{n}':>16}")
        report["categories"][category] = {
            "ours": o.to_dict(), "ours_full_vocabulary": f.to_dict(), "vllm": v.to_dict(), "relative_difference": diff,
            "vllm_eagle_equals_vllm_off": same, "ours_equals_vllm_off": ours_same, "requests": n,
            "texts": {"vllm_off": plain[category]["texts"], "vllm_eagle": eagle[category]["texts"],
                      "ours": mine[category]["texts"]}}
    (out / "check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"MAL: mean acceptance length = 1 + accepted / drafts; ours: the drafter as trained (its draft vocabulary); "
          f"full voc.: ours drafting over the whole vocabulary, as the export does; diff = vLLM / full voc. - 1. "
          f"Written: {out / 'check.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
