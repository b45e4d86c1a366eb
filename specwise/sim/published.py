"""Published GPU sweeps of speculative decoding, predicted on paper.

specwise/calc/data/published_sweeps.json holds measurements others published (papers, engine
blogs, issues): per series the source, engine, GPU, model and the calc arm that stands for its
setup, per point the load and the published ratio. Each point is predicted with the catalog's
figures and the calculators' own code, nothing copied:
  load "batch" (a fixed batch decoding): calc/throughput.py's decode_rates at context
    prompt + output / 2; at a fixed batch the ratio of throughputs equals that of TPOTs;
  load "rate" (Poisson arrivals): the flat simulator (sim/flat.py), mean TPOT off / spec.
error = predicted / published - 1; the summary is the median absolute error, over all points and
over the held-out ones (role "held_out": no setting of specwise was chosen to match them).
A step-time fit others published (fixed + per token + per KV token, engine/cost/linear_cost.py's form) can
stand in for the roofline's target step on points of its GPU, tensor parallelism and model.

Worked example: published 1.50, predicted 1.65: error +10%; with a second point published 2.00,
predicted 1.50 (-25%), the median absolute error is (10% + 25%) / 2 = 17.5%.
"""

import json
import statistics
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specwise.bench.inputs.request import WorkloadRequest
from specwise.bench.load.arrivals import LoadPoint
from specwise.bench.load.metrics import point_metrics
from specwise.calc.arms import OFF, SpecArm, parse_arm
from specwise.calc.catalog import get_gpu, get_model
from specwise.calc.deployment import Deployment, DeploymentConfig
from specwise.calc.roofline import RooflineCost
from specwise.calc.throughput import decode_rates
from specwise.engine.cost.linear_cost import LinearStepCost
from specwise.engine.cost.step_cost import StepCostModel
from specwise.errors import ConfigError, InputError
from specwise.sim.flat import FlatSimulator
from specwise.sim.simulator import SimServerConfig

ROLES = ("fit", "held_out")
LOAD_KINDS = ("batch", "rate")
SERIES_FIELDS = ("id", "citation", "url", "where", "engine", "gpu", "model", "metric", "arm",
                 "prompt_tokens", "output_tokens", "role", "points")
RATE_REQUESTS = 200          # requests per arm at a rate point: enough for a steady mean TPOT


@dataclass(frozen=True)
class PublishedPoint:
    series: str
    citation: str
    url: str
    where: str
    engine: str
    gpu: str
    tp: int
    model: str
    arm: str                    # calc arm text, e.g. "eagle:k=3,rate=0.597,cost=0.057"
    load_kind: str              # "batch" or "rate"
    load: float                 # batch size, or requests per second
    prompt_tokens: int
    output_tokens: int
    metric: str
    published: float            # spec / off: throughput ratio, or TPOT off / spec
    role: str                   # "fit" or "held_out"
    assumptions: tuple[str, ...] = ()
    fitted: str = ""            # what was chosen to match this point (role "fit")


@dataclass(frozen=True)
class StepTimeFit:
    id: str
    citation: str
    url: str
    engine: str
    gpu: str
    tp: int
    model: str
    fixed_s: float
    per_token_s: float
    per_kv_token_s: float

    def cost(self) -> LinearStepCost:
        return LinearStepCost(self.fixed_s, self.per_token_s, self.per_kv_token_s,
                              description=f"published step-time fit {self.id}")

    def covers(self, point: PublishedPoint) -> bool:
        return (get_gpu(self.gpu).name, self.tp, get_model(self.model).name) == \
            (get_gpu(point.gpu).name, point.tp, get_model(point.model).name)


@dataclass(frozen=True)
class Prediction:
    point: PublishedPoint
    predicted: float

    @property
    def error(self) -> float:
        return relative_error(self.predicted, self.point.published)


def data_path() -> Path:
    return Path(str(resources.files("specwise.calc").joinpath("data", "published_sweeps.json")))


def read_data(path: str | Path | None = None) -> dict:
    path = Path(path) if path else data_path()
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: not valid JSON ({error.msg}, line {error.lineno})") from None


def load_points(path: str | Path | None = None) -> list[PublishedPoint]:
    """Every published point, each with its series' source and setup; checked as it is read."""
    points = []
    for series in read_data(path).get("series", []):
        missing = [name for name in SERIES_FIELDS if series.get(name) in (None, "", [])]
        if missing:
            raise ConfigError(f"published series {series.get('id', '?')!r}: missing {', '.join(missing)}")
        name = series["id"]
        if series["role"] not in ROLES:
            raise ConfigError(f"published series {name!r}: role must be one of {', '.join(ROLES)}")
        if series["role"] == "fit" and not series.get("fitted"):
            raise ConfigError(f"published series {name!r}: a fit series says what was fitted on it ('fitted')")
        kind = series.get("load_kind", "batch")
        if kind not in LOAD_KINDS:
            raise ConfigError(f"published series {name!r}: load_kind must be one of {', '.join(LOAD_KINDS)}")
        get_gpu(series["gpu"]), get_model(series["model"])          # catalog entries: unknown ones fail here
        for entry in series["points"]:
            if not entry.get("published", 0) > 0 or not entry.get("load", 0) > 0:
                raise ConfigError(f"published series {name!r}: every point needs load > 0 and published > 0")
            points.append(PublishedPoint(
                series=name, citation=series["citation"], url=series["url"], where=series["where"],
                engine=series["engine"], gpu=series["gpu"], tp=int(series.get("tp", 1)), model=series["model"],
                arm=entry.get("arm", series["arm"]), load_kind=kind, load=float(entry["load"]),
                prompt_tokens=int(series["prompt_tokens"]), output_tokens=int(series["output_tokens"]),
                metric=series["metric"], published=float(entry["published"]), role=series["role"],
                assumptions=tuple(series.get("assumptions", ())), fitted=series.get("fitted", "")))
    return points


def load_step_time_fits(path: str | Path | None = None) -> list[StepTimeFit]:
    fits = []
    for entry in read_data(path).get("step_time_fits", []):
        try:
            fit = StepTimeFit(**{name: entry[name] for name in StepTimeFit.__dataclass_fields__})
        except KeyError as missing:
            raise ConfigError(f"step-time fit {entry.get('id', '?')!r}: missing {missing}") from None
        get_gpu(fit.gpu), get_model(fit.model)
        if fit.fixed_s < 0 or fit.per_token_s < 0 or fit.per_kv_token_s < 0:
            raise ConfigError(f"step-time fit {fit.id!r}: coefficients must be >= 0")
        fits.append(fit)
    return fits


def not_reproduced(path: str | Path | None = None) -> list[dict]:
    """Published results recorded but not predicted, each with the reason."""
    return read_data(path).get("not_reproduced", [])


def deployment_for(point: PublishedPoint, forward_overhead_ms: float = 0.0) -> Deployment:
    """The point's GPUs and model with the calculators' defaults (efficiencies, dtypes); only the
    per-pass overhead is a parameter, as docs/calculators.md uses one."""
    return Deployment.from_config(DeploymentConfig(model=point.model, gpu=point.gpu, tp=point.tp,
                                                   forward_overhead_ms=forward_overhead_ms))


def predict(point: PublishedPoint, forward_overhead_ms: float = 0.0, seed: int = 0,
            step_cost: StepCostModel | None = None) -> float:
    """`step_cost`: the target's step time instead of the roofline (drafting still as the arm says)."""
    deployment = deployment_for(point, forward_overhead_ms)
    cost = step_cost or RooflineCost(deployment)
    arm = parse_arm(point.arm, cost, deployment)
    if point.load_kind == "batch":
        context = point.prompt_tokens + point.output_tokens / 2
        return decode_rates(cost, arm, int(point.load), context).ratio
    tpot = {which.name: _simulated_tpot(point, cost, deployment, which, seed) for which in (OFF, arm)}
    return tpot[OFF.name] / tpot[arm.name]


def _simulated_tpot(point: PublishedPoint, cost: StepCostModel, deployment: Deployment, arm: SpecArm,
                    seed: int) -> float:
    requests = [WorkloadRequest(request_id=str(i), category="published", max_tokens=point.output_tokens,
                                prompt_tokens=point.prompt_tokens, ignore_eos=True) for i in range(RATE_REQUESTS)]
    capacity = deployment.memory_plan(arm.drafter).kv_capacity_tokens
    simulator = FlatSimulator(cost, SimServerConfig(), capacity, seed=seed)
    result = simulator.run(requests, arm, LoadPoint("rate", point.load))
    return point_metrics(result.records).tpot.mean


def predict_all(points: list[PublishedPoint], forward_overhead_ms: float = 0.0) -> list[Prediction]:
    return [Prediction(point, predict(point, forward_overhead_ms)) for point in points]


def predict_with_fits(points: list[PublishedPoint], fits: list[StepTimeFit]) -> list[Prediction | None]:
    """Each point predicted with the first published step-time fit that covers it (None where none does)."""
    predictions = []
    for point in points:
        fit = next((fit for fit in fits if fit.covers(point)), None)
        predictions.append(Prediction(point, predict(point, step_cost=fit.cost())) if fit else None)
    return predictions


def relative_error(predicted: float, published: float) -> float:
    return predicted / published - 1.0


def median_abs_error(predictions: list[Prediction], role: str | None = None) -> float | None:
    """Median of |predicted / published - 1| over the predictions (of one role, if given); None if none."""
    errors = [abs(p.error) for p in predictions if role is None or p.point.role == role]
    return statistics.median(errors) if errors else None
