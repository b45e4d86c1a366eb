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

test: setup
	$(BIN)/python -m pytest

test-all: setup
	$(BIN)/python -m pytest -m "" 
