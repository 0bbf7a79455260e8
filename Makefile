# The README's two commands: `make run` (set up + default job) and `make test` (set up + test suite).
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
CONFIG ?= configs/storm.yaml

.PHONY: setup run test test-all lint
setup: $(STAMP)

$(STAMP): pyproject.toml
	bash scripts/setup.sh $(PY) $(VENV)
	rm -f $(VENV)/.installed-* && touch $@

run: setup
	$(BIN)/python cli.py fit --config $(CONFIG)

test: setup
	$(BIN)/python -m pytest -q

test-all: setup
	$(BIN)/python -m pytest -q -m "slow or not slow"

lint: setup
	$(BIN)/ruff check lit_iclr tests benchmarks
