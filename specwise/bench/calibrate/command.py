"""`specwise calibrate --endpoint URL [--speculative-arm METHOD=URL ...]`: sweep, fit, write the profile.

Each endpoint's waves (sweep.py) become StepSamples (samples.py), fitted by the same least squares
as own-engine `calibrate` (engine/step_fit.py). The profile holds the plain endpoint's fit as
"linear" and each speculating endpoint's own fit under "linear"."drafting"[METHOD], the same
format `specwise calibrate` writes for our engine (engine/step_profile.py): `simulate`, `calc`
and the recommendation read it. The residuals are printed per step; a sweep too short to fit,
or one whose fit misses its own steps by more than MAX_MEDIAN_RESIDUAL, is refused in one line.
"""

import asyncio
import json
import time
from dataclasses import asdict

import numpy as np
from rich.progress import Progress

from specwise.bench.calibrate.sweep import Probe, SweepDesign, Wave, run_sweep
from specwise.bench.load.targets.http import HttpTarget, check_endpoint
from specwise.engine.step_fit import Fit, FitOptions, fit
from specwise.engine.step_profile import PROFILE_FORMAT
from specwise.errors import ConfigError

MAX_MEDIAN_RESIDUAL = 0.10     # a fit that misses its own steps by more (median) is noise, not a profile
PLAIN = "off"


def parse_arms(texts: list[str]) -> dict[str, str]:
    """["ngram=http://..."] -> {"ngram": "http://..."}."""
    arms = {}
    for text in texts:
        method, _, url = text.partition("=")
        if not method or not url or method == PLAIN:
            raise ConfigError(f"--speculative-arm takes METHOD=URL (e.g. ngram=http://127.0.0.1:8001), got {text!r}")
        if method in arms:
            raise ConfigError(f"--speculative-arm {method} is given twice")
        arms[method] = url
    return arms


def calibrate_endpoints(endpoint: str, arms: dict[str, str], design: SweepDesign, model: str | None,
                        output: str, options: FitOptions | None = None) -> dict:
    """Run the sweep, fit each endpoint, write and return the profile; ConfigError when it cannot fit."""
    urls = {PLAIN: endpoint} | arms
    for name, url in urls.items():
        asyncio.run(check_endpoint(name, url))
    targets = [HttpTarget(name=name, base_url=url, model=model, continuous_usage=True) for name, url in urls.items()]
    started = time.perf_counter()
    with Progress() as progress:
        task = progress.add_task("calibration sweep", total=(len(design.waves()) + len(design.prefill_tokens))
                                 * len(targets))
        probes, waves = asyncio.run(run_sweep(targets, design, on_step=lambda: progress.advance(task)))
    elapsed = time.perf_counter() - started
    fits = {name: _fit(name, [w for w in waves if w.endpoint == name], [p for p in probes if p.endpoint == name],
                       options) for name in urls}
    served = targets[0].model or "model?"
    linear = fits[PLAIN].to_json()
    if arms:
        linear["drafting"] = {method: fits[method].to_json() for method in arms}
    profile = {"format": PROFILE_FORMAT, "version": 1, "machine": f"endpoint {endpoint}", "model": served,
               "linear": linear,
               "calibration": {"endpoints": urls, "design": asdict(design), "seconds": round(elapsed, 1),
                               "prefills": [_probe_json(probe) for probe in probes],
                               "waves": [_wave_json(wave) for wave in waves]}}
    with open(output, "w", encoding="utf-8") as stream:
        json.dump(profile, stream, indent=1)
    print(f"wrote {output} (sweep {elapsed:.0f} s)")
    return profile


def _fit(name: str, waves: list[Wave], probes: list[Probe], options: FitOptions | None = None) -> Fit:
    samples = [wave.steps.decode for wave in waves if wave.steps and wave.steps.decode]
    samples += [probe.sample for probe in probes if probe.sample]
    dropped = sum(1 for wave in waves if not wave.steps or wave.steps.decode is None)
    try:
        result = fit(samples, options)
    except ConfigError as error:
        raise ConfigError(f"endpoint {name}: {error}" + (f" ({dropped} waves gave no clean decode window)"
                                                        if dropped else "")) from None
    print(f"endpoint {name}: fitted {result.summary()}")
    for line in result.residual_lines():
        print(line)
    median = float(np.median(np.abs(result.relative_residuals)))
    if median > MAX_MEDIAN_RESIDUAL:
        raise ConfigError(f"endpoint {name}: the sweep is too noisy to fit: its steps miss the fit by {median:.0%} "
                          f"(median; at most {MAX_MEDIAN_RESIDUAL:.0%}): calibrate on a quieter machine or with "
                          f"longer --output-tokens")
    return result


def _wave_json(wave: Wave) -> dict:
    steps = wave.steps
    out = {"endpoint": wave.endpoint, "batch_size": wave.batch_size, "prompt_tokens": wave.prompt_tokens,
           "errors": sum(1 for r in wave.records if r.error)}
    if steps and steps.decode:
        out |= {"decode_seconds": steps.decode.seconds, "tokens": steps.decode.tokens,
                "kv_tokens": steps.decode.kv_tokens, "pairs": steps.decode.pairs, "window_steps": steps.window_steps,
                "spread": round(steps.spread, 4)}
    return out


def _probe_json(probe: Probe) -> dict:
    out = {"endpoint": probe.endpoint, "prompt_tokens": probe.prompt_tokens,
           "errors": sum(1 for r in probe.records if r.error)}
    if probe.sample:
        out |= {"ttft_seconds": probe.sample.seconds, "tokens": probe.sample.tokens, "pairs": probe.sample.pairs}
    return out
