# Two entry points (see README): `make evaluate` and `make test`. Both set up .venv first.
# The venv sees system site-packages, so a torch you already have is kept; on a machine
# without torch we install the CPU build (torch==2.13.0) before anything can pull a CUDA one.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.specwise-installed

.PHONY: setup evaluate test test-all

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

evaluate: setup
	$(BIN)/specwise evaluate --quick

# On a CPU with more than AVX2, the kernel-, dtype- and compile-dependent tests (marked cpu_kernels) run a
# second time with PyTorch and oneDNN held to AVX2 (no AVX-512, no native bf16), as on most laptops and many
# cloud VMs, so that machine can never break it. The rest of the suite does not depend on the instruction set.
test: setup
	$(BIN)/python -m pytest
	@if [ "$$($(BIN)/python -c 'import torch; print(torch.backends.cpu.get_cpu_capability())')" = AVX512 ]; then \
	  echo "== the cpu_kernels tests again, held to AVX2 (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2) =="; \
	  ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 $(BIN)/python -m pytest -m "cpu_kernels and not slow and not integration"; fi

test-all: setup
	$(BIN)/python -m pytest -m "" 
