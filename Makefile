# Two entry points: `make demo` (synthesize -> ingest -> train -> evaluate on a small built-in dataset)
# and `make test`. Both create .venv and install everything on first use.
PY ?= python3
# Which torch build: TORCH_INDEX empty installs torch from the default package index (on Linux, PyPI's torch wheels are
# the CUDA builds, several GB; a mirror may serve CPU builds instead). For a CPU-only build name the CPU index:
#   make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
# TORCH_SPEC pins the version; where that version is not served, any torch>=2.4 from the same index is taken.
TORCH_INDEX ?=
TORCH_SPEC ?= torch==2.13.0
# Optional extras installed with the project: `make install EXTRAS=test,cloud` adds s3fs and gcsfs (shards in object
# storage); `make install-cloud` adds them to an existing .venv.
EXTRAS ?= test
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast install install-cloud clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first, from the index chosen above, so that the `torch>=2.4` requirement below is already met
	$(BIN)/pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) \
	  || $(BIN)/pip install -q "torch>=2.4" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

install-cloud: $(STAMP)
	$(BIN)/pip install -q -e ".[$(EXTRAS),cloud]"

demo: $(STAMP)
	BIN=$(BIN) bash scripts/demo.sh demo-out

test: $(STAMP)  # two pytest processes (pytest-xdist): each test's own subprocesses leave a core idle much of the time
	$(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=15

test-fast: $(STAMP)  # the tier for editing: everything but the end-to-end training and packaging runs
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) demo-out
