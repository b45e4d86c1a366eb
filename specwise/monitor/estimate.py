"""`specwise estimate`: the acceptance a drafter would get on logged traffic, and what it would pay.

For each logged request, replay.py gives the SpecStats the engine would record (n-gram:
exact under greedy; model drafters: teacher-forced). They are merged per category and
overall, so every figure is SpecStats' (acceptance rate, mean acceptance length,
per-position acceptance), plus the share of decode steps that drafted:
    drafted share = drafts / decode steps,  decode steps = output tokens - 1 - accepted
(a step emits accepted + 1 tokens; the first output token comes from prefill).

The speedup goes through the throughput calculator (calc/throughput.py, `decode_rates`): an
arm with the measured per-position acceptance and drafted share, k, and the drafting cost
(n-gram: none; layer_skip:L: L / layers of a target step; draft:PATH: --draft-cost), on a
named GPU and catalog model (roofline) or a measured step profile, at each concurrency,
with every sequence at context = mean prompt + mean completion / 2 of the log. Sequences
that find nothing to draft (share 1 - f of the steps) verify one token: a step's cost is
taken as plain + f x (all-drafting - plain), its tokens per sequence as 1 + f x (E - 1),
with E = 1 + sum of the per-position acceptance (the step cost is close to linear in the
tokens it verifies, which is what the interpolation assumes).

Worked example: per-position acceptance [0.8, 0.6, 0.5, 0.5] at k = 4 with every step
drafting: E = 1 + 2.4 = 3.4 tokens per verification step; if at batch 8 a 5-token
verification costs 1.25 plain steps, speculation gives 3.4 / 1.25 = 2.7x the tokens/s.
"""

from dataclasses import dataclass, field

from specwise.calc.arms import build_arm
from specwise.calc.deployment import Deployment
from specwise.calc.throughput import decode_rates
from specwise.engine.cost.step_cost import StepCostModel
from specwise.engine.spec_decode.metrics import SpecStats
from specwise.errors import ConfigError
from specwise.monitor.logs import LoggedRequest
from specwise.monitor.replay import Drafter, replay


@dataclass
class CategoryEstimate:
    stats: SpecStats = field(default_factory=SpecStats)
    requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0

    def add(self, request: LoggedRequest, stats: SpecStats) -> None:
        self.stats = self.stats.merge(stats)
        self.requests += 1
        self.prompt_tokens += len(request.prompt_token_ids)
        self.output_tokens += len(request.completion_token_ids)

    @property
    def decode_steps(self) -> int:
        return max(0, self.output_tokens - self.requests - self.stats.accepted_tokens)

    @property
    def drafted_share(self) -> float | None:
        return self.stats.drafts / self.decode_steps if self.decode_steps else None

    @property
    def mean_context(self) -> float:
        """Mean prompt + half the mean completion: where a decoding sequence sits on average."""
        return (self.prompt_tokens + self.output_tokens / 2) / self.requests if self.requests else 0.0

    def to_dict(self) -> dict:
        return {**self.stats.to_dict(), "requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "drafted_share": self.drafted_share}


@dataclass
class Estimate:
    method: str
    k: int
    overall: CategoryEstimate = field(default_factory=CategoryEstimate)
    categories: dict[str, CategoryEstimate] = field(default_factory=dict)
    sampled_requests: int = 0            # logged with temperature > 0: the greedy figure is an approximation

    def add(self, request: LoggedRequest, stats: SpecStats) -> None:
        self.overall.add(request, stats)
        if request.category != "*":
            self.categories.setdefault(request.category, CategoryEstimate()).add(request, stats)
        if request.temperature:
            self.sampled_requests += 1

    def to_dict(self) -> dict:
        return {"method": self.method, "k": self.k, "overall": self.overall.to_dict(),
                "categories": {name: value.to_dict() for name, value in sorted(self.categories.items())},
                "sampled_requests": self.sampled_requests}


def estimate_acceptance(requests, drafter: Drafter, method: str, k: int) -> Estimate:
    """Replay every logged request (an iterable, consumed once) and merge the counters."""
    result = Estimate(method=method, k=k)
    for request in requests:
        if not request.completion_token_ids:
            continue
        result.add(request, replay(drafter, request.prompt_token_ids, request.completion_token_ids, k,
                                   request.max_tokens))
    return result


@dataclass(frozen=True)
class SpeedupEstimate:
    concurrency: int
    off_tokens_per_s: float
    spec_tokens_per_s: float

    @property
    def ratio(self) -> float:
        return self.spec_tokens_per_s / self.off_tokens_per_s


def expected_speedup(part: CategoryEstimate, method: str, k: int, cost: StepCostModel, deployment: Deployment,
                     concurrency: list[int], draft_cost: float | None) -> list[SpeedupEstimate]:
    """Tokens/s with and without this drafter at each concurrency, through the throughput calculator."""
    positions = part.stats.per_position_acceptance
    if not positions or not part.drafted_share:
        raise ConfigError(f"{method} drafted nothing on this log: no speedup to estimate")
    rates = (positions + [0.0] * k)[:k]                        # a position never drafted: never accepted
    keys = {"k": str(k), "positions": "/".join(f"{rate:.6f}" for rate in rates)}
    if method != "ngram":
        if draft_cost is None:
            raise ConfigError(f"say what drafting with {method} costs: --draft-cost FRACTION of a target step")
        keys["cost"] = str(draft_cost)
    elif draft_cost:
        keys["cost"] = str(draft_cost)
    arm = build_arm("ngram" if method == "ngram" else method.split(":")[0], keys, cost, deployment)
    share = min(1.0, part.drafted_share)
    tokens = 1.0 + share * (arm.acceptance["*"].expected_tokens(k) - 1.0)    # per sequence per step
    estimates = []
    for batch in concurrency:
        row = decode_rates(cost, arm, batch, part.mean_context)    # every sequence drafting k
        step = row.off_step_s + share * (row.spec_step_s - row.off_step_s)
        estimates.append(SpeedupEstimate(batch, row.off_tokens_per_s, batch * tokens / step))
    return estimates
