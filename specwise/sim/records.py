"""Simulated runs -> the results format `evaluate` writes (run.json + requests.jsonl).

Each request's chunks are rebuilt from the simulation: one chunk of 1 token at the end of
each prefill step it took part in, then one chunk per verification step (1 + accepted
tokens, the last one cut to max_tokens), timed at the step's end. Accepted drafts come
from the same per-request uniform stream the simulation drew from, so the tokens add
up to what the simulation emitted.
"""

import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from specwise.bench.results import RequestRecord, write_run_info
from specwise.sim.flat import FlatResult
from specwise.sim.state import SimState
from specwise.sim.simulator import SimResult


def build_records(result: SimResult) -> list[RequestRecord]:
    state = result.state
    chunks = _chunks(state)
    records = []
    recorded = state.recorded()
    for i, request in enumerate(state.requests):
        if not recorded[i]:
            continue
        base = dict(arm=state.arm.name, method=state.arm.method, load_kind=state.load.kind,
                    load_value=state.load.value, category=request.category, request_id=request.request_id,
                    prompt_tokens=int(state.prompt[i]), send_time=float(state.send[i]))
        if i in state.errors:
            records.append(RequestRecord(**base, output_tokens=0, error=state.errors[i]))
            continue
        first, last = chunks["bounds"][i], chunks["bounds"][i + 1]
        record = RequestRecord(**base, output_tokens=int(state.out[i]),
                               ttft=float(state.first_token[i] - state.send[i]),
                               e2e=float(state.finish[i] - state.send[i]),
                               chunk_times=chunks["times"][first:last].tolist(),
                               chunk_tokens=chunks["tokens"][first:last].tolist())
        if state.arm.speculative:
            record.drafts, record.draft_tokens, record.accepted_tokens = (
                int(chunks[key][i]) for key in ("drafts", "draft_tokens", "accepted"))
            record.accepted_per_position = chunks["per_position"][i].tolist()
        records.append(record)
    return records


def _chunks(state: SimState) -> dict:
    """Every chunk of every request, request after request, as flat arrays.

    A block is one prefill chunk or one run of decode steps; chunks expand blocks:
    times relative to the request's send, tokens, and per-request acceptance sums."""
    req, decode, start, length = _blocks(state)
    block = np.repeat(np.arange(len(length)), length)                   # block of each chunk
    local = np.arange(len(block)) - np.repeat(np.cumsum(length) - length, length)
    owner, is_decode = req[block], decode[block]
    ends = np.concatenate(state.step_ends) if state.step_ends else np.zeros(0)
    ks = np.repeat([k for k, _ in state.step_k], [n for _, n in state.step_k]).astype(np.int64)
    step = np.where(is_decode, start[block].astype(np.int64) + local, 0)
    times = np.where(is_decode, ends[step] if len(ends) else 0.0, start[block])
    counts = np.bincount(owner, minlength=len(state.requests))
    bounds = np.concatenate(([0], np.cumsum(counts)))
    u_index = _uniform_index(state, owner, is_decode, bounds)
    # a step where the drafter proposed nothing verified 1 token: k = 0 there
    k = np.where(is_decode & state.drafting(u_index, state.cat[owner]), ks[step] if len(ks) else 0, 0)
    accepted = _accepted(state, owner, u_index, k)
    tokens = accepted + 1
    _cut_to_length(tokens, bounds, state.out, counts)
    per_position = (accepted[:, None] > np.arange(state.max_k)).astype(np.int64)
    return {"bounds": bounds, "tokens": tokens, "times": np.round(times - state.send[owner], 6),
            "drafts": _per_request(k > 0, owner, len(counts)), "draft_tokens": _per_request(k, owner, len(counts)),
            "accepted": _per_request(accepted, owner, len(counts)),
            "per_position": np.stack([_per_request(column, owner, len(counts)) for column in per_position.T], axis=1)
            if state.max_k else np.zeros((len(counts), 0), dtype=np.int64)}


def _blocks(state: SimState) -> tuple[np.ndarray, ...]:
    """(request, is decode, prefill time or first step, chunk count) per block, in order."""
    rows = []
    for i, segments in enumerate(state.segments):
        for segment in segments:
            if segment[0] == "p":
                rows.append((i, 0, segment[1], 1))
            else:
                rows.append((i, 1, segment[1], segment[2] - segment[1]))
    table = np.array(rows, dtype=float).reshape(-1, 4)
    return (table[:, 0].astype(np.int64), table[:, 1].astype(bool), table[:, 2], table[:, 3].astype(np.int64))


def _uniform_index(state: SimState, owner, is_decode, bounds) -> np.ndarray:
    """[chunks] the uniform each chunk's step drew: the request's n-th decode step used its n-th."""
    decode_index = np.cumsum(is_decode) - 1                             # decode chunks so far, all requests
    before = np.concatenate(([0], np.cumsum(is_decode)))[bounds[:-1]]  # decode chunks before each request
    return state.u_offset[owner] + np.where(is_decode, decode_index - before[owner], 0)


def _accepted(state: SimState, owner, u_index, k) -> np.ndarray:
    """Accepted drafts per chunk."""
    if not state.max_k:
        return np.zeros(len(owner), dtype=np.int64)
    u = state.uniforms[u_index]
    drafted = np.arange(state.max_k)[None, :] < k[:, None]             # [chunks, max_k]
    return ((u[:, None] < state.p[state.cat[owner]]) & drafted).sum(axis=1)


def _per_request(values, owner, count: int) -> np.ndarray:
    return np.bincount(owner, weights=values, minlength=count).astype(np.int64)


def _cut_to_length(tokens: np.ndarray, bounds, out, counts) -> None:
    """The final step may accept more drafts than max_tokens leaves room for: cut its chunk."""
    has = counts > 0
    sums = np.bincount(np.repeat(np.arange(len(counts)), counts), weights=tokens, minlength=len(counts))
    excess = (sums - out).astype(np.int64)[has]
    last = bounds[1:][has] - 1
    if np.any(excess < 0) or np.any(excess >= tokens[last]):
        raise RuntimeError("simulation bookkeeping: a request's chunks do not add up to its length")
    tokens[last] -= excess


def write_results(out_dir, results: list[SimResult], run_info: dict) -> list[RequestRecord]:
    """Write run.json and requests.jsonl (one line per request per arm per load)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run_info = {"tool": "simulate", "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                **run_info}
    write_run_info(out_dir, run_info)
    records = []
    with open(out_dir / "requests.jsonl", "w", encoding="utf-8") as file:
        for result in results:
            batch = result.records if isinstance(result, FlatResult) else build_records(result)
            records.extend(batch)
            file.writelines(json.dumps(vars(record), separators=(",", ":")) + "\n" for record in batch)
    return records
