"""Does evaluate's acceptance equal the server's own speculative counters over the run?

    python benchmarks/check_acceptance.py RUN_DIR

RUN_DIR holds what benchmarks/vs_vllm.sh writes with SPEC=ngram: `evaluate/run.json` and, per
server arm NAME, `NAME-before.txt` / `NAME-after.txt` (its /metrics page scraped right before and
after the evaluation, which ran without warm-up). For each arm: drafts, draft tokens, accepted
tokens and accepted per position summed over evaluate's load points, next to the deltas of the
server's counters (vLLM's vllm:spec_decode_*, ours specwise:spec_decode_*), and the three
acceptance figures from each. Prints figures; asserts nothing.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specwise.engine.spec_decode.metrics import SpecStats  # noqa: E402
from specwise.monitor.exposition import parse_snapshot  # noqa: E402


def evaluate_totals(run: dict, arm: str) -> SpecStats:
    entries = [entry for entry in run.get("server_acceptance", []) if entry["arm"] == arm]
    per_position: list[int] = []
    for entry in entries:
        for index, count in enumerate(entry.get("accepted_per_position") or []):
            per_position += [0] * (index + 1 - len(per_position))
            per_position[index] += round(count)
    return SpecStats(drafts=round(sum(e["drafts"] or 0 for e in entries)),
                     draft_tokens=round(sum(e["draft_tokens"] or 0 for e in entries)),
                     accepted_tokens=round(sum(e["accepted_tokens"] or 0 for e in entries)),
                     accepted_per_position=per_position)


def counter_deltas(before_path: Path, after_path: Path) -> SpecStats:
    before, after = (parse_snapshot(path.read_text(), 0.0, str(path)).acceptance for path in (before_path, after_path))
    positions = [round(a - b) for a, b in zip(after.accepted_per_position or [],
                                              (before.accepted_per_position or []) + [0] * 64)]
    while positions and positions[-1] == 0:
        positions.pop()
    return SpecStats(drafts=round(after.drafts - before.drafts),
                     draft_tokens=round(after.draft_tokens - before.draft_tokens),
                     accepted_tokens=round(after.accepted_tokens - before.accepted_tokens),
                     accepted_per_position=positions)


def describe(stats: SpecStats) -> str:
    positions = " ".join(f"{rate:.3f}" for rate in stats.per_position_acceptance)
    return (f"drafts {stats.drafts}, draft tokens {stats.draft_tokens}, accepted {stats.accepted_tokens}, "
            f"per position {stats.accepted_per_position}; rate {stats.acceptance_rate:.4f}, "
            f"mean length {stats.mean_acceptance_length:.4f}, per-position rates {positions}")


def main(run_dir: str) -> int:
    root = Path(run_dir)
    run = json.loads((root / "evaluate" / "run.json").read_text())
    for before in sorted(root.glob("*-before.txt")):
        arm = before.name.removesuffix("-before.txt")
        ours, theirs = evaluate_totals(run, arm), counter_deltas(before, root / f"{arm}-after.txt")
        same = (ours.drafts, ours.draft_tokens, ours.accepted_tokens, ours.accepted_per_position) == \
               (theirs.drafts, theirs.draft_tokens, theirs.accepted_tokens, theirs.accepted_per_position)
        print(f"{arm}:\n  evaluate        {describe(ours)}\n  server counters {describe(theirs)}\n"
              f"  equal: {'yes' if same else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
