"""How many drafts survive: i.i.d. acceptance (Leviathan et al.'s alpha) or measured per-position rates.

Per-position acceptance p_i is the definition in docs/design.md: drafts accepted at position i /
drafts. Acceptance is prefix-wise (position i survives only if 1..i-1 did), so
p_1 >= p_2 >= ... and a verification step emits 1 + sum_i p_i tokens on average.
With i.i.d. acceptance alpha, p_i = alpha^i and the expected tokens per step is
(1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023, eq. 1).

alpha is not the measured acceptance rate (accepted / drafted): at k drafts per step
that rate is (alpha + alpha^2 + ... + alpha^k) / k. `alpha_from_acceptance_rate` converts.

Some drafters propose nothing at some steps: n-gram lookup finds no earlier occurrence of
the recent tokens, and that sequence's step verifies 1 token and emits 1. `draft_fraction`
is the share of a sequence's decode steps that carried drafts (measured: drafts / decode
steps, with decode steps = output tokens - 1 - accepted tokens); the per-position rates
describe the steps that drafted, as the measured counters do.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specwise.bench.results import read_records, read_run_info
from specwise.errors import ConfigError, InputError


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """(1 - alpha^(k+1)) / (1 - alpha): tokens one verification step of k drafts emits."""
    _check_alpha(alpha)
    if k < 0:
        raise ConfigError(f"k must be >= 0, got {k}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def alpha_from_acceptance_rate(rate: float, k: int) -> float:
    """The i.i.d. alpha whose accepted / drafted ratio at k drafts per step equals `rate`."""
    if not 0.0 <= rate <= 1.0 or k < 1:
        raise ConfigError(f"need 0 <= rate <= 1 and k >= 1, got rate={rate}, k={k}")
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if (expected_tokens_per_step(mid, k) - 1) / k < rate:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"acceptance alpha must be in [0, 1], got {alpha}")


@dataclass(frozen=True)
class Acceptance:
    alpha: float | None = None                 # i.i.d. acceptance probability per draft token
    positions: tuple[float, ...] = ()          # measured p_1 >= p_2 >= ... (drafts accepted at i / drafts)
    draft_fraction: float = 1.0                # share of decode steps that carry drafts

    def __post_init__(self):
        if (self.alpha is None) == (not self.positions):
            raise ConfigError("give either an acceptance alpha or per-position acceptance rates, not both")
        if not 0.0 < self.draft_fraction <= 1.0:
            raise ConfigError(f"the share of steps that draft must be in (0, 1], got {self.draft_fraction}")
        if self.alpha is not None:
            _check_alpha(self.alpha)
            return
        rates = np.asarray(self.positions, dtype=float)
        if np.any(rates < 0) or np.any(rates > 1):
            raise ConfigError(f"per-position acceptance rates must be in [0, 1], got {list(self.positions)}")
        if np.any(np.diff(rates) > 1e-9):
            raise ConfigError(f"per-position acceptance must not increase with position (a draft is accepted "
                              f"only after every earlier one was), got {list(self.positions)}")

    @property
    def max_k(self) -> int | None:
        """Most drafts per step this acceptance describes (None: any)."""
        return None if self.alpha is not None else len(self.positions)

    def rates(self, k: int) -> np.ndarray:
        """[k] probabilities that draft position 1..k is accepted."""
        if self.max_k is not None and k > self.max_k:
            raise ConfigError(f"measured acceptance covers k <= {self.max_k}; cannot predict k={k}")
        if self.alpha is not None:
            return self.alpha ** np.arange(1, k + 1, dtype=float)
        return np.asarray(self.positions[:k], dtype=float)

    def expected_tokens(self, k: int) -> float:
        if self.alpha is not None:
            return expected_tokens_per_step(self.alpha, k)
        return 1.0 + float(self.rates(k).sum())

    def acceptance_rate(self, k: int) -> float:
        """accepted / drafted at k drafts per step (the acceptance rate of docs/design.md)."""
        return (self.expected_tokens(k) - 1.0) / k if k else 0.0

    def describe(self) -> str:
        text = f"alpha={self.alpha:g}" if self.alpha is not None else \
            "positions=" + "/".join(f"{p:.3g}" for p in self.positions)
        return text if self.draft_fraction == 1.0 else f"{text}, drafted={self.draft_fraction:.3g}"


def measured_acceptance(results_dir, arm: str) -> dict[str, Acceptance]:
    """Per-position acceptance and the share of steps that drafted, for one arm of an `evaluate`
    result: one entry per workload category plus "*" for all together, from the requests'
    counters; for endpoint arms that carry none, from the server counters in run.json ("*" only)."""
    records = _arm_records(Path(results_dir), arm)
    totals = _request_totals(records) or _server_totals(Path(results_dir), arm, records)
    if not totals:
        raise InputError(f"{results_dir}: arm {arm!r} has no per-position acceptance counts "
                         "(neither per request nor from the server)")
    return {key: _acceptance(*values) for key, values in totals.items()}


def measured_requests(results_dir, arm: str) -> dict[str, list]:
    """category -> the arm's measured requests that carry acceptance counters (their spread)."""
    by_category: dict[str, list] = {}
    for record in _arm_records(Path(results_dir), arm):
        if record.drafts is not None:
            by_category.setdefault(record.category, []).append(record)
    return by_category


def _acceptance(drafts: float, accepted: np.ndarray, steps: float) -> Acceptance:
    # summed over requests with different k the ratios can wiggle; keep them non-increasing
    rates = np.minimum.accumulate(np.minimum(accepted / drafts, 1.0))
    fraction = min(1.0, drafts / steps) if steps > 0 else 1.0
    return Acceptance(positions=tuple(float(rate) for rate in rates), draft_fraction=fraction)


def _arm_records(results_dir: Path, arm: str) -> list:
    return [record for record in read_records(results_dir)
            if record.arm == arm and not record.warmup and not record.error]


def _decode_steps(output_tokens: float, accepted_tokens: float) -> float:
    """The first token comes from the prefill; each decode step emits 1 + its accepted drafts."""
    return max(0.0, output_tokens - 1 - accepted_tokens)


def _add(totals: dict, key: str, drafts: float, per_position, steps: float) -> None:
    old_drafts, old, old_steps = totals.get(key, (0.0, np.zeros(0), 0.0))
    width = max(len(old), len(per_position))
    summed = np.pad(old, (0, width - len(old))) + np.pad(np.asarray(per_position, float),
                                                         (0, width - len(per_position)))
    totals[key] = (old_drafts + drafts, summed, old_steps + steps)


def _request_totals(records: list) -> dict:
    """Requests that never drafted still count their steps (the share of steps that drafted)."""
    totals: dict = {}
    for record in records:
        if record.drafts is None:
            continue
        steps = _decode_steps(record.output_tokens, record.accepted_tokens or 0)
        per_position = record.accepted_per_position if record.drafts else None
        drafts = record.drafts if per_position else 0
        for key in (record.category, "*"):
            _add(totals, key, drafts, per_position or [], steps)
    return {key: value for key, value in totals.items() if value[0] > 0}


def _server_totals(results_dir: Path, arm: str, records: list) -> dict:
    totals: dict = {}
    if not (results_dir / "run.json").exists():
        return totals
    for entry in read_run_info(results_dir).get("server_acceptance", []):
        if entry.get("arm") == arm and entry.get("drafts") and entry.get("accepted_per_position"):
            _add(totals, "*", entry["drafts"], entry["accepted_per_position"], 0.0)
    if totals:
        drafts, accepted, _ = totals["*"]
        steps = sum(_decode_steps(record.output_tokens, 0) for record in records) - accepted.sum()
        totals["*"] = (drafts, accepted, steps)
    return totals
