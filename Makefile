# The two set-up commands of the README: `make train` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-stamp
STEPS   ?=
ARGS    ?=
# pytest's workers (pytest-xdist): two, CI's cores; JOBS=0 runs the tests in one process, one after another
JOBS    ?= 2
XDIST   := -n $(JOBS) --dist worksteal

.PHONY: train test test-fast adapter engines clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

adapter: $(STAMP)
	bash scripts/ensure_adapter.sh $(BIN)/python

# the second engine (Dawn on SwiftShader), the browser (Chromium) and the libraries the comparisons
# run against (PyTorch's CPU build, transformers, peft), for make test only
engines: $(STAMP)
	@bash scripts/ensure_engines.sh $(BIN)/python

# Dawn, Chrome's engine, on SwiftShader, Chrome's CPU Vulkan driver: a small GPU's limits (256
# invocations a workgroup, 4-lane subgroups, 256-byte offset alignment) and Tint's validation.
DAWN       := TINYGPT_WEBGPU=dawn VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json
DAWN_TESTS := tests/device/test_kernels.py tests/model/test_lora.py::test_scale_against_its_twin \
              tests/device/test_attention.py::test_attention_against_float64 \
              tests/device/test_attention.py::test_online_reads_half_q_k_v tests/device/test_attention.py::test_online_turns_dq_and_dk_back \
              tests/model/test_window.py::test_windowed_attention_against_float64 \
              tests/device/test_attention.py::test_packed_windows_attend_within_their_records \
              tests/model/test_model.py::test_step0_logits_loss_and_every_gradient tests/model/test_model.py::test_ten_adamw_steps_match_reference \
              "tests/model/test_optim.py::test_steps_of_each_optimizer_match_float64[muon-1-False]"

# Trains the default preset (small, its schedule) on the built-in corpus for 3.5 minutes: the
# step count is fitted to the time, so it ends within 4 minutes whatever the CPU's speed.
# STEPS=N trains N steps instead; ARGS="..." passes more to the trainer. The checkpoint is
# runs/PRESET.tinygpt (runs/small.tinygpt; ARGS="--preset medium" writes runs/medium.tinygpt).
MINUTES ?= 3.5
train: adapter
	$(BIN)/tinygpt train $(if $(STEPS),--steps $(STEPS),--minutes $(MINUTES)) $(ARGS)

# Everything on the preferred adapter (Vulkan's lavapipe on a CPU), its 25 slowest tests named (the
# suite's 25 minutes are spent there first: docs/results.md, Tests), then the
# kernel tests again on OpenGL (llvmpipe) where that adapter exists, the slow-marked ones
# (GPT-2's shape at one layer, attention at T = 2048) left to the first run: on GL's kernels
# without subgroups the one-layer GPT-2 alone took most of that run (docs/results.md, Tests).
# The kernel tests (and the f16 ones) run again with lavapipe's subgroups at 4 and 16 lanes
# (LP_NATIVE_VECTOR_WIDTH 128 and 512; the default is 8): GPUs have 8 to 64, and the subgroup
# kernels must hold at each size or be refused by the plan's check (they are at 4, on lavapipe as
# on SwiftShader); there the f16 kernels are tested, not the numerics check and the overflow run, which
# only compose them. Of the sliding window's tests only the path with subgroup kernels runs there
# (online_sg.wgsl), as of packed windows' attention: the other paths' kernels and attn_decode take none, and compiling them again at
# each width cost 8 minutes of a fresh clone's run; nor at head dim 128, whose rows held in
# registers were most of the 16-lane window run's time (docs/results.md, Tests): a head's width sets
# how many vec4 a lane holds, not how the subgroup reduces, which the other four shapes test.
# The OpenGL run has no shader-f16: there tests/device/test_f16.py checks the refusal.
# Last, Dawn on SwiftShader: the kernel tests, every attention path (with a sliding window too)
# and whole training steps (AdamW's, and Muon's: its Newton-Schulz matmuls under Tint) against
# the float64 reference.
test: adapter engines
	$(BIN)/python -m pytest -q $(XDIST) --durations=25 $(ARGS)
	@for w in 128 512; do echo "== kernel tests with LP_NATIVE_VECTOR_WIDTH=$$w =="; \
		LP_NATIVE_VECTOR_WIDTH=$$w $(BIN)/python -m pytest -q $(XDIST) \
			tests/device/test_kernels.py tests/model/test_decode.py tests/device/test_f16.py -k "not gate and not numerics_check and not precision_with_a_feature and not absurd" $(ARGS) || exit 1; \
		LP_NATIVE_VECTOR_WIDTH=$$w $(BIN)/python -m pytest -q $(XDIST) tests/model/test_window.py tests/device/test_attention.py \
			-k "(windowed_attention or packed_windows) and online and not online-tiles and not -128-" $(ARGS) \
			|| exit 1; done
	@if TINYGPT_BACKEND=gl $(BIN)/python -m tinygpt info --brief >/dev/null 2>&1; then \
		echo "== kernel tests on the OpenGL adapter =="; \
		TINYGPT_BACKEND=gl $(BIN)/python -m pytest -q $(XDIST) -m "kernel and not slow" $(ARGS) || exit 1; \
	else echo "== GL kernel run skipped: $$(TINYGPT_BACKEND=gl $(BIN)/python -m tinygpt info --brief 2>&1 | grep error: | tail -1) =="; fi
	@if $(DAWN) $(BIN)/python -m tinygpt info --brief >/dev/null 2>&1; then \
		echo "== kernel tests and whole training steps on Dawn + SwiftShader =="; \
		$(DAWN) $(BIN)/python -m pytest -q $(XDIST) $(DAWN_TESTS) $(ARGS); \
	else echo "== Dawn run skipped: $$($(DAWN) $(BIN)/python -m tinygpt info --brief 2>&1 | grep error: | tail -1) =="; fi

# The inner loop, a few minutes on a 2-core CPU (docs/testing.md): the layering and the reference,
# every kernel against its twin, the optimizers' steps, the file formats and the online attention,
# on the preferred adapter only. make test runs all of it and the rest, on every backend.
FAST := tests/test_layers.py tests/reference/test_reference.py tests/device/test_kernels.py tests/model/test_optim.py tests/files/test_format.py \
        tests/files/test_tokenfile.py tests/device/test_attention.py
test-fast: adapter
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow" $(FAST) -k "not float64 or online" $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
