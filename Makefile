# The two set-up commands of the README: `make train` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-stamp
STEPS   ?=
ARGS    ?=

.PHONY: train test test-fast adapter clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

adapter: $(STAMP)
	bash scripts/ensure_adapter.sh $(BIN)/python

# Trains the default preset (small, its schedule) on the built-in corpus for 3.5 minutes: the
# step count is fitted to the time, so it ends within 4 minutes whatever the CPU's speed.
# STEPS=N trains N steps instead; ARGS="..." passes more to the trainer.
MINUTES ?= 3.5
train: adapter
	$(BIN)/tinygpt train --out runs/small.tinygpt $(if $(STEPS),--steps $(STEPS),--minutes $(MINUTES)) $(ARGS)

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
