"""Measured step costs: a grid of forward-pass times, interpolated.

Profile JSON (written by `specwise calibrate` or by hand):

    {
      "format": "specwise-step-profile", "version": 1,
      "machine": "1x H100 SXM, vLLM 0.6.3",          free text, shown in reports
      "model": "llama-3.1-8b",                       free text
      "batch_sizes":    [1, 8, 32, 128],             increasing
      "tokens_per_seq": [1, 2, 5, 512],              increasing; 1 + k for verification steps
      "context_lens":   [0, 1024, 4096, 16384],      increasing; KV tokens cached per sequence
      "seconds": [[[...], ...], ...],                seconds[b][t][c], shape
                                                     [len(batch_sizes)][len(tokens_per_seq)][len(context_lens)]
      "prefill_tokens":  [256, 1024, 4096],          optional: prompt tokens in one prefill step,
      "prefill_seconds": [0.9, 3.4, 14.8],           its time, measured with prompts of
      "prefill_prompt_len": 256,                     this length (1, 4 and 16 of them)
      "prefill_pads_to_longest": true,               optional: the engine pads a prefill step's
                                                     prompts to its longest (specwise's flat steps do not)
      "linear": {"fixed_s": 0.02, "per_token_s": 5e-4,   optional: the least-squares fit of
                 "per_kv_token_s": 2e-6,             engine/cost/step_fit.py; a profile with no grid
                 "per_logits_row_s": 1e-3,           (no "seconds") is read as that linear model
                 "drafting": {"ngram": {...}}, ...}  (optional: per logits row; a speculating
                                                     server's own fit per drafting method)
      "calibration": {"design": {                    optional: how calibrate --endpoint swept;
          "max_num_batched_tokens": 512, ...}, ...}  the server's token budget a step, where known
    }                                                (simulate's default; profile_token_budget)

Between grid points the time is piecewise linear along each axis; beyond the edges it is
extended linearly from the last two points (so a batch twice the largest measured one
costs what the trend says), and never below zero. Steps with unequal contexts use
the mean context. A prefill step costs what the prefill axis says for its total prompt
tokens; without one, n prompts of mean length L are read as the step (batch n, L tokens
per sequence, context 0) of the grid. An engine that pads prompts to the longest one in
the step computes n x longest tokens: with prefill_pads_to_longest, that is the total
(and L the longest). Worked example: prompts of 50 and 300 tokens cost 350 tokens' time
without padding, 600 with it.
"""

import json
from pathlib import Path

import numpy as np

from specwise.engine.cost.linear_cost import LinearStepCost
from specwise.engine.cost.step_cost import StepCostModel, check_step_shape
from specwise.errors import InputError

PROFILE_FORMAT = "specwise-step-profile"
PLAIN_ENDPOINT = "off"      # calibrate --endpoint's name for the server that does not speculate (its waves, its fit)
AXES = ("batch_sizes", "tokens_per_seq", "context_lens")
PREFILL_KEYS = ("prefill_tokens", "prefill_seconds", "prefill_prompt_len", "prefill_pads_to_longest")


class ProfileCost(StepCostModel):
    def __init__(self, batch_sizes, tokens_per_seq, context_lens, seconds, machine: str = "", model: str = "",
                 prefill: dict | None = None):
        self.axes = [np.asarray(values, dtype=float) for values in (batch_sizes, tokens_per_seq, context_lens)]
        self.seconds = np.asarray(seconds, dtype=float)
        self.machine, self.model = machine, model
        self.prefill = prefill or {}          # PREFILL_KEYS, or empty
        self._check()
        self._check_prefill()
        self.description = f"measured profile: {model or 'model?'} on {machine or 'machine?'}"

    def _check(self) -> None:
        for name, axis in zip(AXES, self.axes):
            if axis.ndim != 1 or len(axis) < 1 or np.any(np.diff(axis) <= 0):
                raise InputError(f"profile {name} must be a non-empty increasing list")
        shape = tuple(len(axis) for axis in self.axes)
        if self.seconds.shape != shape:
            raise InputError(f"profile seconds has shape {self.seconds.shape}, expected {shape} "
                             "(batch_sizes x tokens_per_seq x context_lens)")
        if not np.all(np.isfinite(self.seconds)) or np.any(self.seconds < 0):
            raise InputError("profile seconds must be finite and >= 0")

    def _check_prefill(self) -> None:
        if "prefill_tokens" not in self.prefill and "prefill_seconds" not in self.prefill:
            return
        tokens, seconds = (np.asarray(self.prefill.get(key, []), dtype=float) for key in PREFILL_KEYS[:2])
        if tokens.ndim != 1 or len(tokens) < 1 or np.any(np.diff(tokens) <= 0) or tokens.shape != seconds.shape:
            raise InputError("profile prefill_tokens must be an increasing list, with one prefill_seconds each")
        if not np.all(np.isfinite(seconds)) or np.any(seconds < 0):
            raise InputError("profile prefill_seconds must be finite and >= 0")

    @classmethod
    def load(cls, path) -> "ProfileCost":
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InputError(f"{path}: no such profile file") from None
        except json.JSONDecodeError as error:
            raise InputError(f"{path}: not valid JSON ({error.msg}, line {error.lineno})") from None
        if data.get("format") != PROFILE_FORMAT:
            raise InputError(f"{path}: not a step profile (expected \"format\": \"{PROFILE_FORMAT}\")")
        missing = [key for key in (*AXES, "seconds") if key not in data]
        if missing:
            raise InputError(f"{path}: profile lacks {', '.join(missing)}")
        return cls(*(data[key] for key in (*AXES, "seconds")), machine=data.get("machine", ""),
                   model=data.get("model", ""), prefill={key: data[key] for key in PREFILL_KEYS if key in data})

    def to_json(self) -> dict:
        return {"format": PROFILE_FORMAT, "version": 1, "machine": self.machine, "model": self.model,
                **{name: axis.tolist() for name, axis in zip(AXES, self.axes)},
                "seconds": self.seconds.tolist(), **self.prefill}

    def _context_curve(self, batch_size: float, tokens_per_seq: float) -> np.ndarray:
        """Times over the context grid at this batch size and tokens per sequence."""
        b0, b1, wb = _bracket(self.axes[0], batch_size)
        t0, t1, wt = _bracket(self.axes[1], tokens_per_seq)
        grid = self.seconds
        by_tokens = [(1 - wb) * grid[b0, t] + wb * grid[b1, t] for t in (t0, t1)]
        return (1 - wt) * by_tokens[0] + wt * by_tokens[1]

    def step_times(self, batch_size: int, tokens_per_seq: int, total_context) -> np.ndarray:
        check_step_shape(batch_size, tokens_per_seq)
        mean_context = np.asarray(total_context, dtype=float) / batch_size
        curve = self._context_curve(batch_size, tokens_per_seq)
        return np.maximum(_interp(self.axes[2], curve, mean_context), 0.0)

    def prefill_time(self, prompt_lens) -> float:
        lens = np.asarray(prompt_lens, dtype=float)
        length = lens.max() if self.prefill.get("prefill_pads_to_longest") else lens.mean()
        if "prefill_tokens" in self.prefill:
            tokens, seconds = (np.asarray(self.prefill[key], dtype=float) for key in PREFILL_KEYS[:2])
            return float(max(_interp(tokens, seconds, np.array([len(lens) * length]))[0], 0.0))
        return float(self.step_times(len(lens), max(1, round(float(length))), np.zeros(1))[0])


def prefill_prompts(total: int, prompt_len: int) -> tuple[int, int]:
    """The prompts making up a timed prefill step of about `total` tokens (engine/profiler.py), as
    (how many, their length): the profile's prefill axis. Worked example: 1024 at prompt_len 256 ->
    (4, 256); 41 at 32 -> (1, 41); 128 at 32 -> (4, 32)."""
    num_prompts = max(1, round(total / prompt_len))
    return num_prompts, max(1, total // num_prompts)


def load_step_cost(path) -> StepCostModel:
    """A profile file as a step-cost model: its grid (ProfileCost) where it has one, else its
    linear fit ("linear": {"fixed_s", "per_token_s", "per_kv_token_s"}, engine/cost/linear_cost.py)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return ProfileCost.load(path)                 # its one-line error
    if data.get("format") == PROFILE_FORMAT and "refused" in data:
        raise InputError(f"{path}: a sweep calibrate could not fit ({data['refused']}), kept for "
                         f"`specwise calibrate --refit {path}`: not a profile")
    if data.get("format") == PROFILE_FORMAT and "seconds" not in data and isinstance(data.get("linear"), dict):
        try:
            return LinearStepCost.from_json(data["linear"], description=f"linear fit: {data.get('model') or 'model?'}"
                                                                        f" on {data.get('machine') or 'machine?'}")
        except ValueError as error:
            raise InputError(f"{path}: profile linear {error}") from None
    return ProfileCost.load(path)


def profile_token_budget(path) -> int | None:
    """The calibrated server's token budget a step, where the profile recorded one (`calibrate --endpoint`
    writes it under "calibration"."design"): None for any other profile, or an unreadable one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        budget = data["calibration"]["design"]["max_num_batched_tokens"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return budget if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0 else None


def calibration_waves(path, batch_size: int, endpoint: str = PLAIN_ENDPOINT) -> list[dict]:
    """The waves a `calibrate --endpoint` sweep recorded for that endpoint at that batch size (each with its
    "kv_tokens" and "decode_seconds"); [] for any other profile, or an unreadable one."""
    try:
        waves = json.loads(Path(path).read_text(encoding="utf-8"))["calibration"]["waves"]
        return [wave for wave in waves if wave.get("endpoint") == endpoint and wave.get("batch_size") == batch_size
                and not wave.get("errors") and float(wave.get("decode_seconds", 0)) > 0
                and float(wave.get("kv_tokens", -1)) >= 0]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _bracket(axis: np.ndarray, x: float) -> tuple[int, int, float]:
    """Indices of the two grid points around x and x's weight on the second (outside [0, 1]
    when extrapolating)."""
    if len(axis) == 1:
        return 0, 0, 0.0
    i = int(np.clip(np.searchsorted(axis, x) - 1, 0, len(axis) - 2))
    return i, i + 1, float((x - axis[i]) / (axis[i + 1] - axis[i]))


def _interp(axis: np.ndarray, values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """np.interp with linear extension past both ends."""
    if len(axis) == 1:
        return np.full_like(x, values[0])
    i = np.clip(np.searchsorted(axis, x) - 1, 0, len(axis) - 2)
    weight = (x - axis[i]) / (axis[i + 1] - axis[i])
    return values[i] + weight * (values[i + 1] - values[i])
