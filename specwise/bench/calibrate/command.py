"""`specwise calibrate --endpoint URL [--speculative-arm METHOD=URL ...]`: sweep, fit, write the profile.

Each endpoint's waves (sweep.py) become StepSamples (samples.py), fitted by the same least squares
as own-engine `calibrate` (engine/cost/step_fit.py). The profile holds the plain endpoint's fit as
"linear" and each speculating endpoint's own fit under "linear"."drafting"[METHOD], the same
format `specwise calibrate` writes for our engine (engine/cost/step_profile.py): `simulate`, `calc`
and the recommendation read it. The residuals are printed per step; a sweep too short to fit,
or one whose fit misses its own steps by more than MAX_MEDIAN_RESIDUAL, is refused in one line; what it
swept is kept then (PROFILE.refused.json, no fit in it), for `calibrate --refit` with other fit options.

Each endpoint's count probe (counts.py) says what a step of a token count the server has not run
lately costs it, and how many counts it keeps: it comes off the prefill probes' TTFTs before the fit (the
waves' decode windows leave out the one step of a wave that may pay it, samples.py), the profile keeps it
beside the fit, the simulator charges it (--no-count-cost: none of that, the sweep fitted as if the probe
had not run).

A prompt longer than the server's token budget is prefilled in chunks, a step each (samples.py
`prefill_sample`): the budget comes from --max-num-batched-tokens, else from the server where it says
(`specwise serve` does), else every probe counts as one step, and a line says so. How the server reads
its KV cache (engine/cost/kv_reads.py: ours in padded groups) comes the same way, from --kv-reads, else the
server, else each sequence reads its own: a wave's KV tokens are counted so, and the profile keeps it.

A server that says the steps it ran (`specwise serve`'s GET /steps) is fitted on those instead of its
waves' chunks (logged.py): the number of its next step is noted before the sweep, the steps from there
read after it, and kept beside the profile (profile.steps.jsonl); --no-server-steps fits the waves.

Every request the sweep sent is kept beside the profile (profile.requests.jsonl, the evaluator's
record format), so that `calibrate --refit PROFILE` fits the same sweep again (with
--fit-attention-pairs, say) without a server.
"""

import asyncio
import dataclasses
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
from rich.progress import Progress

from specwise.bench.calibrate.counts import CountCost, count_cost, paid
from specwise.bench.calibrate.logged import logged_samples, residual_table
from specwise.bench.calibrate.samples import prefill_sample, wave_admissions
from specwise.bench.calibrate.sweep import Probe, Sweep, SweepDesign, Wave, regroup, run_sweep, wave_tag
from specwise.bench.load.targets.http import HttpTarget, announced, check_endpoint, server_steps
from specwise.bench.results import read_records_file
from specwise.engine.cost.kv_reads import KVReads
from specwise.engine.cost.step_fit import Fit, FitOptions, fit
from specwise.engine.cost.step_profile import PLAIN_ENDPOINT, PROFILE_FORMAT
from specwise.errors import ConfigError, InputError

MAX_MEDIAN_RESIDUAL = 0.10     # a fit that misses its own steps by more (median) is noise, not a profile


def parse_arms(texts: list[str]) -> dict[str, str]:
    """["ngram=http://..."] -> {"ngram": "http://..."}."""
    arms = {}
    for text in texts:
        method, _, url = text.partition("=")
        if not method or not url or method == PLAIN_ENDPOINT:
            raise ConfigError(f"--speculative-arm takes METHOD=URL (e.g. ngram=http://127.0.0.1:8001), got {text!r}")
        if method in arms:
            raise ConfigError(f"--speculative-arm {method} is given twice")
        arms[method] = url
    return arms


def calibrate_endpoints(endpoint: str, arms: dict[str, str], design: SweepDesign, model: str | None,
                        output: str, options: FitOptions | None = None) -> dict:
    """Run the sweep, fit each endpoint, write and return the profile; ConfigError when it cannot fit."""
    urls = {PLAIN_ENDPOINT: endpoint} | arms
    for name, url in urls.items():
        asyncio.run(check_endpoint(name, url))
    design = _with_what_the_server_says(design, endpoint)
    targets = [HttpTarget(name=name, base_url=url, model=model, continuous_usage=True) for name, url in urls.items()]
    # where a server says its steps (ours), the number of the next it will run: the sweep's are those from there
    marks = {name: said[1] for name, url in urls.items() if (said := asyncio.run(server_steps(url, 0, limit=0)))}
    started = time.perf_counter()
    with Progress() as progress:
        steps = len(design.waves()) + len(design.prefill_tokens) + (1 if design.count_probes else 0)
        task = progress.add_task("calibration sweep", total=steps * len(targets))
        sweep = asyncio.run(run_sweep(targets, design, on_step=lambda: progress.advance(task)))
    elapsed = time.perf_counter() - started
    sweep.logged = {name: lines for name, mark in marks.items() if (lines := _steps_since(name, urls[name], mark))}
    requests = Path(output).with_suffix(".requests.jsonl")
    # kept before the fit: a sweep that does not fit can be looked at, and refitted
    records = [r for item in sweep.probes for r in item.records] + [r for rs in sweep.counts.values() for r in rs]
    records += [r for wave in sweep.waves for r in wave.records]
    requests.write_text("".join(r.to_json() + "\n" for r in records), encoding="utf-8")
    calibration = {"endpoints": urls, "design": asdict(design), "seconds": round(elapsed, 1),
                   "requests": requests.name}
    if sweep.logged:
        logged = Path(output).with_suffix(".steps.jsonl")
        logged.write_text("".join(json.dumps({"endpoint": name} | line) + "\n"
                                  for name, lines in sweep.logged.items() for line in lines), encoding="utf-8")
        calibration["steps"] = logged.name
    try:
        profile = _write_profile(urls, sweep, calibration, targets[0].model or "model?", output, options)
    except ConfigError as error:
        kept = Path(output).with_suffix(".refused.json")
        kept.write_text(json.dumps({"format": PROFILE_FORMAT, "refused": str(error),
                                    "model": targets[0].model or "model?", "calibration": calibration | _swept(sweep)},
                                   indent=1), encoding="utf-8")
        raise ConfigError(f"{error} (the sweep is kept: `specwise calibrate --refit {kept}` fits it again)") from None
    print(f"wrote {output} (sweep {elapsed:.0f} s)")
    return profile


def _with_what_the_server_says(design: SweepDesign, endpoint: str) -> SweepDesign:
    """The design with the server's token budget and KV reads: as given, else as the server says, else none
    (a line says which)."""
    said = asyncio.run(announced(endpoint))
    budget = design.max_num_batched_tokens
    if budget is None and said.max_num_batched_tokens is None:
        print("calibrate: the server does not say its token budget a step: every prefill probe is taken as one "
              "step (give --max-num-batched-tokens N where the server prefills a longer prompt in chunks of N)")
    elif budget is None:
        budget = said.max_num_batched_tokens
        print(f"calibrate: the server takes at most {budget} tokens a step: a longer probe counts as its chunks")
    reads = design.kv_reads
    if reads is None:
        reads = said.kv_reads.text() if said.kv_reads else "none"
        if said.kv_reads:
            print(f"calibrate: the server says its attention reads its KV cache in groups of "
                  f"{said.kv_reads.group_size} to the longest context, in blocks of {said.kv_reads.block_size}: "
                  f"a step's KV tokens read are counted so")
    return dataclasses.replace(design, max_num_batched_tokens=budget, kv_reads=reads)


def _steps_since(name: str, url: str, mark: int) -> list[dict]:
    """The steps the endpoint says it ran from `mark` on; none (a line says why) where it lost some."""
    said = asyncio.run(server_steps(url, mark))
    if said is None or len(said[0]) != said[1] - mark:
        print(f"endpoint {name}: the server said its steps before the sweep but not all of them after it "
              f"(restarted, or it ran more than it keeps): what the client saw is fitted")
        return []
    print(f"endpoint {name}: the server says the {len(said[0])} steps it ran during the sweep (GET /steps): they "
          f"are fitted, with the prefill probes' TTFTs for its request overhead (--no-server-steps: not)")
    return said[0]


def refit(profile_paths: list[str], output: str, options: FitOptions | None = None,
          max_num_batched_tokens: int | None = None, kv_reads: str | None = None) -> dict:
    """Fit recorded sweeps again (each a profile and the requests kept beside it), write the profile to output.
    Several sweeps of the same servers (two hours apart, or one before and one after a run) are fitted as one:
    their waves and probes together, each wave its own sample, so the fit lies between the machine's states.
    max_num_batched_tokens, kv_reads: the server's token budget and KV reads ("16/16", "none"), in place of
    those the first sweep recorded (a sweep recorded before KV reads were: none)."""
    given = [_recorded(path) for path in profile_paths]
    # the first profile named gives the endpoints and the design (a refit's own, with the flags it was given)
    profile, calibration = given[0][0], given[0][0]["calibration"]
    recorded = [sweep for _, sweeps in given for sweep in sweeps]
    profile_paths = [path for path, _, _ in recorded]
    urls = calibration["endpoints"]
    for path, other, _ in recorded[1:]:
        if sorted(other["calibration"]["endpoints"]) != sorted(urls):
            raise ConfigError(f"calibrate --refit: {path} swept the endpoints "
                              f"{sorted(other['calibration']['endpoints'])}, {profile_paths[0]} {sorted(urls)}: "
                              f"sweeps fitted together must sweep the same ones")
    design = calibration.get("design") or {}
    budget = max_num_batched_tokens if max_num_batched_tokens is not None else design.get("max_num_batched_tokens")
    if budget is not None and budget < 1:
        raise ConfigError("calibrate --refit: --max-num-batched-tokens must be at least 1")
    reads = kv_reads if kv_reads is not None else design.get("kv_reads") or "none"
    sweep, said = Sweep(), {}           # said: endpoint -> the steps it said in each sweep that kept them
    for path, other, requests in recorded:
        shared = {(w["endpoint"], wave_tag(w["batch_size"], w["prompt_tokens"])): tuple(w["shared_drafts"])
                  for w in other["calibration"].get("waves", []) if w.get("shared_drafts")}
        one = regroup(read_records_file(requests), shared, budget, KVReads.parse(reads))
        if one.counts and sweep.counts and (options or FitOptions()).count_cost:
            raise ConfigError(f"calibrate --refit: {path} ran a count probe, and so did a sweep before it: fit "
                              f"several sweeps together without it (--no-count-cost), or one at a time")
        sweep.probes += one.probes
        sweep.waves += one.waves
        sweep.counts |= one.counts
        for name, lines in _kept_steps(path, other).items():
            said.setdefault(name, []).append(lines)
    # an endpoint fitted on its steps in every sweep or in none: a sweep without them would count only its probes
    partial = sorted(name for name, sweeps in said.items() if len(sweeps) < len(recorded))
    if partial:
        print(f"calibrate --refit: {', '.join(partial)} said its steps in some of these sweeps, not all: what the "
              f"client saw of them is fitted")
    sweep.logged = {name: [line for lines in sweeps for line in lines] for name, sweeps in said.items()
                    if name not in partial}
    calibration = {key: value for key, value in calibration.items() if key != "steps"}
    if len(recorded) > 1:       # a refit of this profile refits the sweeps it was fitted from
        calibration |= {"refitted_from": profile_paths, "requests": [str(r) for _, _, r in recorded]}
    else:
        calibration |= {"refitted_from": profile_paths[0], "requests": str(recorded[0][2])}
        if "steps" in recorded[0][1]["calibration"]:
            calibration["steps"] = str(_steps_path(*recorded[0][:2]))
    calibration["design"] = design | {"max_num_batched_tokens": budget, "kv_reads": reads}
    refitted = _write_profile(urls, sweep, calibration, profile.get("model", "model?"), output, options)
    print(f"wrote {output} (refitted from {', '.join(profile_paths)})")
    return refitted


def _recorded(path: str) -> tuple[dict, list[tuple[str, dict, Path]]]:
    """A profile calibrate --endpoint wrote and the sweeps it holds, each (its profile's path, that profile, the
    requests it kept): its own, or those of the profiles a refit fitted it from together; InputError when it is
    none."""
    try:
        profile = json.loads(Path(path).read_text(encoding="utf-8"))
        several = profile["calibration"].get("refitted_from")
        if isinstance(several, list):
            return profile, [sweep for one in several for sweep in _recorded(one)[1]]
        requests = (Path(path).parent / profile["calibration"]["requests"]).resolve()
        return profile, [(str(Path(path).resolve()), profile, requests)]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        raise InputError(f"{path}: not a profile written by calibrate --endpoint (with its requests kept)")


def _steps_path(path: str, profile: dict) -> Path:
    return Path(path).parent / profile["calibration"]["steps"]


def _kept_steps(path: str, profile: dict) -> dict[str, list[dict]]:
    """The steps a recorded sweep's servers said they ran (PROFILE.steps.jsonl), by endpoint; none kept: {}."""
    if "steps" not in profile["calibration"]:
        return {}
    steps = _steps_path(path, profile)
    logged: dict[str, list[dict]] = {}
    try:
        for text in steps.read_text(encoding="utf-8").splitlines():
            line = json.loads(text)
            logged.setdefault(line.pop("endpoint"), []).append(line)
    except (OSError, ValueError, KeyError, AttributeError):
        raise InputError(f"{steps}: not the steps a sweep's servers said they ran (kept by calibrate --endpoint)")
    return logged


def _write_profile(urls: dict[str, str], sweep: Sweep, calibration: dict, model: str, output: str,
                   options: FitOptions | None) -> dict:
    given = options or FitOptions()
    options = with_pairs_decided(given, sweep.probes)
    client_seen = [name for name in urls if not (options.server_steps and sweep.logged.get(name))]
    if given.fit_attention_pairs is None and client_seen:
        print("calibrate: " + ("every prefill probe ran in one step: a cost per attention pair is fitted"
                               if options.fit_attention_pairs else
                               "a prefill probe ran in chunks: attention pairs are counted, not costed")
              + " (--fit-attention-pairs or --no-fit-attention-pairs to choose)")
    asked = options.count_cost and bool(calibration["design"].get("count_probes"))
    counts = {name: _count_cost(name, sweep.counts.get(name)) for name in urls} if asked else {}
    budget = calibration["design"].get("max_num_batched_tokens")
    reads = KVReads.parse(calibration["design"].get("kv_reads") or "none")
    # the plain server first: its small-batch knee (the weights read whatever the rows) is the machine's and
    # the model's, and its waves of 1, 4, 16, 64 sequences place it; a drafting server's waves (rows 1.5-2 a
    # sequence at batch 1, 7-12 at 4) cannot, so its fit takes the plain server's knee
    def endpoint_fit(name: str, knee: float | None = None) -> Fit:
        logged = sweep.logged.get(name) if options.server_steps else None
        return _fit(name, [w for w in sweep.waves if w.endpoint == name],
                    [p for p in sweep.probes if p.endpoint == name],
                    with_pairs_decided(given, sweep.probes, logged=True) if logged else options, counts.get(name),
                    budget, reads, knee, logged)

    fits = {PLAIN_ENDPOINT: endpoint_fit(PLAIN_ENDPOINT)}
    fits |= {name: endpoint_fit(name, fits[PLAIN_ENDPOINT].cost.min_tokens) for name in urls if name != PLAIN_ENDPOINT}
    linear = fits[PLAIN_ENDPOINT].to_json()
    if len(urls) > 1:
        linear["drafting"] = {method: fits[method].to_json() for method in urls if method != PLAIN_ENDPOINT}
    profile = {"format": PROFILE_FORMAT, "version": 1, "machine": f"endpoint {urls[PLAIN_ENDPOINT]}", "model": model,
               "linear": linear,
               "calibration": calibration | _swept(sweep)
               | {"counts": {name: asdict(cost) for name, cost in counts.items() if cost}}}
    with open(output, "w", encoding="utf-8") as stream:
        json.dump(profile, stream, indent=1)
    return profile


def _swept(sweep: Sweep) -> dict:
    """What the sweep measured, as the profile's "calibration" keeps it (refit reads the waves' shared drafts)."""
    return {"prefills": [_probe_json(probe) for probe in sweep.probes],
            "waves": [_wave_json(wave) for wave in sweep.waves]}


def with_pairs_decided(options: FitOptions, probes: list[Probe], logged: bool = False) -> FitOptions:
    """options with the attention pairs fitted, where left to calibrate (None), if the fit has the steps the
    server said it ran (logged), or else if the server prefilled every probe in one step. A prompt prefilled
    whole computes n (n + 1) / 2 pairs, which a line in its tokens cannot follow: four prompts admitted into
    one step cost far less than one prompt as long (vLLM, 2026-12-06: 757 ms measured at concurrency 4, 905
    predicted without the pairs, 724 with them), and the pairs cut the worst TTFT in all six vLLM sweeps tried.
    A server that runs a longer prompt in chunks (ours, 512 tokens a step) computes a later chunk's pairs
    against the cache, on another path at another cost a pair, and fitted on what the client saw its replays
    came out worse with them in most sweeps. Its own steps give every chunk whole (alone, beside decodes, over
    the cache of the chunks before), which tells the pairs from the tokens: our server's two sweeps of
    2026-12-07 09:03, fitted on its steps with and without them and replayed (median TTFT, TPOT, tok/s
    error): 2.6, 4.4, 2.8% with, 2.8, 4.7, 3.3% without; 2.1, 2.9, 1.9% with, 1.4, 3.1, 2.3% without."""
    if options.fit_attention_pairs is not None:
        return options
    whole = logged or (bool(probes) and all(probe.sample is None or probe.sample.steps == 1 for probe in probes))
    return dataclasses.replace(options, fit_attention_pairs=whole)


def _count_cost(name: str, records) -> CountCost | None:
    """The endpoint's count probe, read (a line says what it found, or why nothing)."""
    cost = count_cost(records) if records else None
    if cost is None:
        errors = [r.error for r in records or [] if r.error]
        why = f"its requests failed ({errors[0]})" if errors else "it did not finish within the budget"
        print(f"endpoint {name}: no count probe, so no cost for a new token count: {why}")
        return None
    print(f"endpoint {name}: {cost.summary()}")
    return cost


def _fit(name: str, waves: list[Wave], probes: list[Probe], options: FitOptions | None = None,
         counts: CountCost | None = None, budget: int | None = None, reads: KVReads | None = None,
         knee: float | None = None, logged: list[dict] | None = None) -> Fit:
    """The endpoint's fit: its waves' decode windows, or the steps it said it ran (`logged`, logged.py), and
    its prefill probes' TTFTs; with a count cost, the probes and the logged steps less what their new counts
    cost (counts.py `paid`, RecentCounts); knee: the small-batch knee to fit with (None: looked for)."""
    steps = (logged_samples(logged, reads, counts) if logged else
             [wave.steps.decode for wave in waves if wave.steps and wave.steps.decode])
    # a wave's admission steps run token counts the server may or may not have kept (counts.py): with a count
    # cost, which of them paid it is unknown, and they are left out
    if not logged and (options or FitOptions()).admission_steps and not (counts and counts.new_count_s):
        steps += [sample for wave in waves if wave.steps
                  for sample in wave_admissions(wave.records, wave.steps, wave.shared_drafts, reads, budget)]
    if counts and counts.new_count_s:
        probes = [dataclasses.replace(probe, sample=prefill_sample(probe.records, budget, cost, reads))
                  for probe, cost in zip(probes, paid([probe.records for probe in probes], counts, budget))]
        print(f"endpoint {name}: the prefill probes below are less what their new token counts cost")
    samples = steps + [probe.sample for probe in probes if probe.sample]
    dropped = 0 if logged else sum(1 for wave in waves if not wave.steps or wave.steps.decode is None)
    try:
        result = fit(samples, options, reads, knee)
        if counts and counts.new_count_s:
            result.cost = result.cost.with_counts(counts.new_count_s, counts.memory)
    except ConfigError as error:
        raise ConfigError(f"endpoint {name}: {error}" + (f" ({dropped} waves gave no clean decode window)"
                                                        if dropped else "")) from None
    print(f"endpoint {name}: fitted {result.summary()}")
    lines = result.residual_lines()
    if logged:      # hundreds of steps: by kind and batch size, and the probes' TTFTs one by one
        lines = residual_table(result.cost, logged, steps) + lines[len(steps):]
    for line in lines:
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
    if wave.shared_drafts:
        out["shared_drafts"] = list(wave.shared_drafts)
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
