"""Drift detection: a one-sided CUSUM on the per-window acceptance rate, against a baseline.

Baseline: the mean acceptance rate mu0 and the spread sigma of the per-window rates over
the first `baseline_windows` (20) windows with figures (or a saved baseline file, written by
`--save-baseline`). A spread estimated from n windows is often too small, and a too-small
sigma means false alarms, so the detector uses the upper 95% confidence bound of sigma,
s * sqrt((n - 1) / chi2_0.05(n - 1)) (x1.37 for n = 20), floored at `min_std` (0.02) so a
very quiet baseline does not turn every small wiggle into evidence.

Each window with at least `min_drafts` drafts updates
    z_t = (mu0 - rate_t) / sigma                 (how far below the baseline, in sigmas)
    S_t = max(0, S_{t-1} + z_t - k)              (k = 0.5: drops under half a sigma add nothing)
and raises one "drift" alert when S_t > h (h = 8). While alarmed no further drift alert is
raised; the alarm clears (a "recovered" event, not an alert) after `recover_windows` (3)
windows in a row with z_t <= k, and S restarts from 0. Windows with too few drafts, failed
scrapes and counter resets carry no evidence: they change nothing.

What the thresholds buy (Gaussian window noise, sigma known; Siegmund's approximation,
checked by simulation in tests/test_monitor_drift.py):
  - detection delay for a drop of d sigmas (sigma as the detector uses it): about (h + 1.166) / (d - k) windows, rounded up:
    d = 2 -> 7 windows, d = 4 -> 3, d >= 9.7 -> 1 (the alert comes with the first window
    after the drop);
  - false alarms on a stationary stream: mean run length about 19,000 windows with sigma
    known (about 13 days of 60 s windows). With mu0 and sigma estimated from 20 baseline
    windows it is shorter: in simulation about 2% of stationary 200-window streams raise a
    false alarm; the documented bound, which the tests check, is 3%.
  - the 0.6 -> 0.3 drop with a per-window spread of 0.03 (sigma used ~0.047, d ~ 6.4): the
    formula gives 2 windows; in simulation the alert always came within 3.

Worked example: baseline mu0 = 0.60, sigma = 0.03. Acceptance drops to 0.30 at window t:
    z_t = (0.60 - 0.30) / 0.03 = 10,  S_t = 0 + 10 - 0.5 = 9.5 > 8  -> one alert at window t.
A smaller drop to 0.54 (d = 2): S grows by 1.5 per window and crosses 8 at the 6th window.
"""

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from specwise.errors import ConfigError, InputError

DEFAULT_K = 0.5
DEFAULT_H = 8.0
DEFAULT_MIN_STD = 0.02
DEFAULT_MIN_DRAFTS = 20
DEFAULT_RECOVER_WINDOWS = 3
BASELINE_VERSION = 1


@dataclass
class Baseline:
    acceptance_rate: float       # mu0: mean of the per-window acceptance rates
    window_std: float            # spread of the per-window rates (before the min_std floor)
    windows: int                 # how many windows it rests on
    window_seconds: float = 0.0  # their mean length (a saved baseline suits windows of that length)
    server: str = ""
    url: str = ""

    @classmethod
    def from_rates(cls, rates: list[float], window_seconds: float = 0.0, server: str = "",
                   url: str = "") -> "Baseline":
        if len(rates) < 2:
            raise ConfigError(f"a baseline needs at least 2 windows with acceptance figures, got {len(rates)}")
        return cls(acceptance_rate=statistics.fmean(rates), window_std=statistics.stdev(rates),
                   windows=len(rates), window_seconds=window_seconds, server=server, url=url)

    def save(self, path) -> None:
        Path(path).write_text(json.dumps({"version": BASELINE_VERSION, **asdict(self)}, indent=2) + "\n",
                              encoding="utf-8")

    @classmethod
    def load(cls, path) -> "Baseline":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as error:
            raise InputError(f"{path}: cannot read the baseline file ({error.strerror or error})") from None
        except json.JSONDecodeError:
            raise InputError(f"{path}: not a baseline file (not JSON)") from None
        if not isinstance(data, dict) or "acceptance_rate" not in data or "window_std" not in data:
            raise InputError(f"{path}: not a baseline file (needs acceptance_rate and window_std; "
                             f"write one with `specwise monitor --save-baseline`)")
        fields = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        baseline = cls(**fields)
        if not 0.0 <= baseline.acceptance_rate <= 1.0 or baseline.window_std < 0:
            raise InputError(f"{path}: acceptance_rate must be in [0, 1] and window_std >= 0")
        return baseline


@dataclass
class DriftSettings:
    k: float = DEFAULT_K                    # allowance, in sigmas
    h: float = DEFAULT_H                    # decision threshold, in sigmas
    min_std: float = DEFAULT_MIN_STD        # floor on sigma, in acceptance-rate units
    min_drafts: int = DEFAULT_MIN_DRAFTS    # windows with fewer drafts carry no evidence
    recover_windows: int = DEFAULT_RECOVER_WINDOWS

    def __post_init__(self):
        if self.k < 0 or self.h <= 0 or self.min_std <= 0 or self.min_drafts < 0 or self.recover_windows < 1:
            raise ConfigError("drift settings need k >= 0, h > 0, min_std > 0, min_drafts >= 0, "
                              "recover_windows >= 1")


@dataclass(frozen=True)
class DriftEvent:
    kind: str            # "drift" (an alert) or "recovered"
    statistic: float     # S_t when it happened
    rate: float          # the window's acceptance rate
    message: str


class CusumDetector:
    """One server's drift test; feed it windows in order with `update`."""

    def __init__(self, baseline: Baseline, settings: DriftSettings | None = None):
        self.baseline = baseline
        self.settings = settings or DriftSettings()
        self.sigma = max(baseline.window_std * std_inflation(baseline.windows), self.settings.min_std)
        self.statistic = 0.0
        self.alarmed = False
        self.calm_windows = 0

    def update(self, rate: float | None, drafts: int | None) -> DriftEvent | None:
        """One window's acceptance rate (None: no figures) and drafts (None: not counted, e.g. SGLang)."""
        s = self.settings
        if rate is None or math.isnan(rate) or (drafts is not None and drafts < s.min_drafts):
            return None
        z = (self.baseline.acceptance_rate - rate) / self.sigma
        if self.alarmed:
            self.calm_windows = self.calm_windows + 1 if z <= s.k else 0
            if self.calm_windows >= s.recover_windows:
                self.alarmed, self.statistic, self.calm_windows = False, 0.0, 0
                return DriftEvent("recovered", 0.0, rate, f"acceptance back near the baseline "
                                  f"({rate:.3f} vs {self.baseline.acceptance_rate:.3f})")
            return None
        self.statistic = max(0.0, self.statistic + z - s.k)
        if self.statistic <= s.h:
            return None
        self.alarmed, self.calm_windows = True, 0
        statistic, self.statistic = self.statistic, 0.0
        return DriftEvent("drift", statistic, rate,
                          f"acceptance rate fell to {rate:.3f} from a baseline of "
                          f"{self.baseline.acceptance_rate:.3f} (CUSUM {statistic:.1f} > h = {s.h:g} sigmas, "
                          f"sigma = {self.sigma:.3f})")

    def state(self) -> dict:
        return {"statistic": self.statistic, "alarmed": self.alarmed, "calm_windows": self.calm_windows}

    def restore(self, state: dict) -> None:
        self.statistic = float(state.get("statistic", 0.0))
        self.alarmed = bool(state.get("alarmed", False))
        self.calm_windows = int(state.get("calm_windows", 0))


def std_inflation(windows: int) -> float:
    """sqrt((n - 1) / chi2_0.05(n - 1)): the upper 95% bound of sigma over the sample spread, with the
    Wilson-Hilferty approximation of the chi-square quantile (1.37 for n = 20, 1.20 for n = 50; at most
    3, which tiny baselines of under 5 windows would exceed)."""
    dof = max(1, windows - 1)
    quantile = dof * (1 - 2 / (9 * dof) - 1.6449 * math.sqrt(2 / (9 * dof))) ** 3
    return min(3.0, math.sqrt(dof / quantile)) if quantile > 0 else 3.0


def expected_delay(drop_sigmas: float, settings: DriftSettings | None = None) -> int | None:
    """Windows from a sustained drop of `drop_sigmas` to the alert (Siegmund's approximation, rounded
    up; at least 1); None when the drop is within the allowance k and may never be detected."""
    s = settings or DriftSettings()
    if drop_sigmas <= s.k:
        return None
    return max(1, math.ceil((s.h + 1.166) / (drop_sigmas - s.k)))
