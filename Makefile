# Two entry points: `make demo` (synthesize -> ingest -> train -> evaluate on a small built-in dataset)
# and `make test`. Both create .venv and install everything on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# The CPU build of torch first, so that the `torch>=2.4` requirement does not pull CUDA wheels.
	$(BIN)/pip install -q "torch==2.13.0" || $(BIN)/pip install -q "torch>=2.4" --index-url https://download.pytorch.org/whl/cpu
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	BIN=$(BIN) bash scripts/demo.sh demo-out

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) demo-out
