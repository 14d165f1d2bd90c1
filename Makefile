# The two set-up commands of the README: `make train` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-stamp
STEPS   ?= 600
ARGS    ?=

.PHONY: train test test-fast adapter clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

adapter: $(STAMP)
	bash scripts/ensure_adapter.sh $(BIN)/python

# Trains the default preset (small) on the built-in corpus; a few minutes on a laptop CPU.
train: adapter
	$(BIN)/tinygpt train --steps $(STEPS) --out runs/small.tinygpt $(ARGS)

# Everything on the preferred adapter (Vulkan's lavapipe on a CPU), then the
# kernel tests again on OpenGL (llvmpipe) where that adapter exists.
test: adapter
	$(BIN)/python -m pytest -q $(ARGS)
	@if $(BIN)/python -c "from tinygpt.gpu import pick_adapter; pick_adapter('gl')" 2>/dev/null; then \
		echo "== kernel tests on the OpenGL adapter =="; \
		TINYGPT_BACKEND=gl $(BIN)/python -m pytest -q -m kernel $(ARGS); \
	else echo "== no OpenGL adapter here: GL kernel run skipped =="; fi

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
