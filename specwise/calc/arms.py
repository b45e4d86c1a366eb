"""Speculation configurations ("arms") for the simulator, named like evaluate's arms.

An arm is written METHOD[:KEY=VALUE,...], for example
    off
    ngram:k=4,alpha=0.6
    suffix:k=8,from=results/eval1,arm=suffix-k8
    lookahead:w=4,n=3,g=4,from=results/eval1
    draft:k=4,alpha=0.8,drafter=qwen2.5-0.5b
    eagle:positions=0.8/0.6/0.45,cost=0.05
    draft:policy=1=5/32=3/128=0,alpha=0.8,drafter=llama-3.2-1b
    draft:k=4,from=results/eval1,arm=draft-k4,drafter=smollm2-135m
Keys: k (default: as many as the measured positions, else 4) | policy (a k table: k_table.py);
acceptance: alpha | positions | rate (measured accepted / drafted at this k) | from (an
evaluate results directory, with arm = its arm name, default this arm's name); drafted
(share of steps that carry drafts, default 1, or as measured with from); drafting
cost: drafter (catalog model or config.json on the same GPUs) | cost (relative to a target
decode step), none needed by the model-free ngram and suffix (drafting on the CPU); budget (drafter KV tokens per sequence); overhead_ms (per verification
step); name; lookahead only: w, n, g (its window, n-gram size and candidates, as the
engine's defaults): k is its prompt-lookup candidate's length (default 4), it verifies up to
max(k, n - 1) positions, and a step costs 1 + (w + g)(n - 1) + max(0, k - (n - 1)) tokens per
sequence (ExtraRowsCost), nothing else to say about drafting; from= defaults to evaluate's
arm name lookahead-wWnNgG-kK.
"""

import dataclasses
from dataclasses import dataclass, field

from specwise.calc.acceptance import Acceptance, alpha_from_acceptance_rate, measured_acceptance, measured_requests
from specwise.calc.catalog import get_model
from specwise.calc.deployment import Deployment
from specwise.calc.drafter import DraftCost, ExtraRowsCost, ModelDraftCost, NoDraftCost, RelativeDraftCost
from specwise.calc.roofline import RooflineCost
from specwise.engine.cost.step_cost import StepCostModel
from specwise.engine.spec_decode.config import SpeculativeConfig
from specwise.engine.spec_decode.k_table import KTable
from specwise.errors import ConfigError

DEFAULT_K = 4             # as the engine's --num-speculative-tokens
MODEL_FREE = ("ngram", "suffix")    # drafters with no model: drafting costs no GPU time
KEYS = ("k", "policy", "alpha", "positions", "rate", "from", "arm", "drafted", "drafter", "cost", "budget",
        "overhead_ms", "name", "w", "n", "g")
LOOKAHEAD_KEYS = ("w", "n", "g")


@dataclass
class SpecArm:
    name: str
    method: str
    policy: KTable | None = None                 # None: no speculation
    acceptance: dict[str, Acceptance] = field(default_factory=dict)   # category -> acceptance, "*" = any
    draft: DraftCost = field(default_factory=NoDraftCost)
    overhead_s: float = 0.0
    drafter: Deployment | None = None             # a draft model sharing the GPUs (for memory)
    # category -> measured requests (from=RESULTS_DIR): the flat simulator draws each request's acceptance
    # from one of them, keeping the request-to-request spread
    measured_requests: dict[str, list] = field(default_factory=dict)

    def __post_init__(self):
        if self.policy is not None and self.policy.max_k > 0 and "*" not in self.acceptance:
            raise ConfigError(f"arm {self.name}: speculation needs an acceptance for all categories ('*')")
        for category, acceptance in self.acceptance.items():
            if self.policy and acceptance.max_k is not None and acceptance.max_k < self.policy.max_k:
                raise ConfigError(f"arm {self.name}: acceptance for {category!r} covers k <= {acceptance.max_k}, "
                                  f"the arm asks for k = {self.policy.max_k}")
        if self.overhead_s < 0:
            raise ConfigError(f"arm {self.name}: overhead must be >= 0")

    @property
    def speculative(self) -> bool:
        return self.policy is not None and self.policy.max_k > 0

    def k_for(self, batch_size: int) -> int:
        return self.policy.k_for(batch_size) if self.policy else 0

    def acceptance_for(self, category: str) -> Acceptance:
        return self.acceptance.get(category, self.acceptance["*"])

    def describe(self) -> dict:
        info = {"name": self.name, "method": self.method}
        if self.policy:
            info["k"] = self.policy.steps[0][1] if self.policy.is_fixed else None
            info["k_policy"] = None if self.policy.is_fixed else self.policy.to_text()
            info["acceptance"] = {key: value.describe() for key, value in self.acceptance.items()}
            info["drafting"] = self.draft.description
            info["overhead_ms"] = self.overhead_s * 1e3
        return info


OFF = SpecArm(name="off", method="off")


def parse_arm(text: str, target: StepCostModel, deployment: Deployment) -> SpecArm:
    method, _, rest = text.strip().partition(":")
    return build_arm(method, _parse_keys(text, rest), target, deployment, text)


def build_arm(method: str, keys: dict[str, str], target: StepCostModel, deployment: Deployment,
              text: str | None = None) -> SpecArm:
    """An arm from its method and KEY=VALUE settings (values as strings, as written on the command line)."""
    method = method.strip().lower()
    text = text or ",".join([method, *(f"{key}={value}" for key, value in keys.items())])
    if not method:
        raise ConfigError(f"arm {text!r}: starts with no method name")
    unknown = sorted(set(keys) - set(KEYS))
    if unknown:
        raise ConfigError(f"arm {text!r}: unknown key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}")
    if method == "off":
        if keys:
            raise ConfigError(f"arm {text!r}: 'off' takes no keys")
        return OFF
    lookahead = _lookahead(text, method, keys)
    policy = _policy(text, keys)
    if lookahead is not None:
        depth = max(lookahead.lookahead_ngram - 1, lookahead.num_speculative_tokens)
        lookahead_name = "lookahead-w{}n{}g{}-k{}".format(lookahead.lookahead_window, lookahead.lookahead_ngram,
                                                           lookahead.lookahead_candidates,
                                                           lookahead.num_speculative_tokens)
        if "from" in keys and "arm" not in keys and "name" not in keys:
            keys = {**keys, "arm": lookahead_name}          # evaluate's name for this arm
        policy = policy if "policy" in keys else KTable.fixed(depth)
        if policy.max_k > depth:
            raise ConfigError(f"arm {text!r}: lookahead verifies at most max(k, n - 1) = {depth} drafts per step, "
                              f"a policy of k = {policy.max_k} asked")
    acceptance = _acceptance(text, method, keys, policy)
    if "drafted" in keys:
        fraction = _number(text, keys, "drafted")
        acceptance = {key: dataclasses.replace(value, draft_fraction=fraction) for key, value in acceptance.items()}
    if policy is None:
        measured = [a.max_k for a in acceptance.values() if a.max_k is not None]
        policy = KTable.fixed(min(measured) if measured else DEFAULT_K)
    if lookahead is not None:
        draft, drafter = ExtraRowsCost(target, lookahead.step_rows), None
        name = keys.get("name") or lookahead_name
    else:
        draft, drafter = _draft_cost(text, method, keys, target, deployment)
        name = keys.get("name") or (f"{method}-k{policy.steps[0][1]}" if policy.is_fixed else f"{method}-adaptive")
    spread = measured_requests(keys["from"], _measured_arm(method, keys, policy)) if "from" in keys else {}
    return SpecArm(name=name, method=method, policy=policy, acceptance=acceptance, draft=draft,
                   overhead_s=_number(text, keys, "overhead_ms", 0.0) / 1e3, drafter=drafter,
                   measured_requests=spread)


def _lookahead(text: str, method: str, keys: dict) -> SpeculativeConfig | None:
    """Lookahead's sizes from w, n, g (the engine's defaults and ranges); None for other methods."""
    given = [key for key in LOOKAHEAD_KEYS if key in keys]
    if method != "lookahead":
        if given:
            raise ConfigError(f"arm {text!r}: {', '.join(given)} apply to lookahead arms only")
        return None
    if "drafter" in keys or "cost" in keys:
        raise ConfigError(f"arm {text!r}: lookahead drafts in the target's own forward: no drafter or cost")
    sizes = {key: _number(text, keys, key, kind=int) for key in given}
    default = SpeculativeConfig("lookahead")
    return SpeculativeConfig("lookahead", _number(text, keys, "k", DEFAULT_K, kind=int),
                             lookahead_window=sizes.get("w", default.lookahead_window),
                             lookahead_ngram=sizes.get("n", default.lookahead_ngram),
                             lookahead_candidates=sizes.get("g", default.lookahead_candidates))


def _parse_keys(text: str, rest: str) -> dict[str, str]:
    keys = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in KEYS:
            raise ConfigError(f"arm {text!r}: {item!r} is not KEY=VALUE with KEY one of {', '.join(KEYS)}")
        keys[key] = value.strip()
    return keys


def _number(text: str, keys: dict, key: str, default=None, kind=float):
    if key not in keys:
        return default
    try:
        return kind(keys[key])
    except ValueError:
        raise ConfigError(f"arm {text!r}: {key}={keys[key]!r} is not a number") from None


def _policy(text: str, keys: dict) -> KTable | None:
    if "k" in keys and "policy" in keys:
        raise ConfigError(f"arm {text!r}: give k or policy, not both")
    if "policy" in keys:
        return KTable.parse(keys["policy"])
    k = _number(text, keys, "k", kind=int)
    return None if k is None else KTable.fixed(k)


def _acceptance(text: str, method: str, keys: dict, policy: KTable | None) -> dict[str, Acceptance]:
    given = [key for key in ("alpha", "positions", "rate", "from") if key in keys]
    if len(given) != 1:
        raise ConfigError(f"arm {text!r}: give exactly one of alpha, positions, rate, from")
    if "alpha" in keys:
        return {"*": Acceptance(alpha=_number(text, keys, "alpha"))}
    if "positions" in keys:
        try:
            rates = tuple(float(value) for value in keys["positions"].split("/"))
        except ValueError:
            raise ConfigError(f"arm {text!r}: positions must be numbers separated by '/'") from None
        return {"*": Acceptance(positions=rates)}
    if "rate" in keys:
        if policy is None or not policy.is_fixed:
            raise ConfigError(f"arm {text!r}: rate needs a fixed k (the rate was measured at that k)")
        k = policy.steps[0][1]
        return {"*": Acceptance(alpha=alpha_from_acceptance_rate(_number(text, keys, "rate"), k))}
    arm = _measured_arm(method, keys, policy)
    if not arm:
        raise ConfigError(f"arm {text!r}: from= needs arm= (the arm's name in that results directory)")
    return measured_acceptance(keys["from"], arm)


def _measured_arm(method: str, keys: dict, policy: KTable | None) -> str | None:
    """The arm's name in the from= results directory."""
    arm = keys.get("arm") or keys.get("name")
    if not arm and policy is not None and policy.is_fixed:
        arm = f"{method}-k{policy.steps[0][1]}"
    return arm


def _draft_cost(text: str, method: str, keys: dict, target: StepCostModel, deployment: Deployment):
    if "drafter" in keys and "cost" in keys:
        raise ConfigError(f"arm {text!r}: give drafter or cost, not both")
    budget = _number(text, keys, "budget", kind=int)
    if "drafter" in keys:
        drafter = deployment.with_model(get_model(keys["drafter"]))
        return ModelDraftCost(RooflineCost(drafter), budget, name=drafter.model.name), drafter
    if budget is not None:
        raise ConfigError(f"arm {text!r}: budget applies to a drafter model (drafter=...)")
    if "cost" in keys:
        return RelativeDraftCost(target, _number(text, keys, "cost")), None
    if method in MODEL_FREE:
        return NoDraftCost(), None
    raise ConfigError(f"arm {text!r}: say what drafting costs: drafter=MODEL or cost=FRACTION of a target step")
