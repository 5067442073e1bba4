# The stable entry point for people, CI and tools. See README.md.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
STAMP   := $(VENV)/.glowlm-installed
PLUGINS := $(sort $(dir $(wildcard plugins/*/pyproject.toml)))
PYTEST_ARGS ?=

.PHONY: install demo test test-slow lint bench bench-models bench-suite clean

install: $(STAMP)

# Idempotent: re-runs only when a pyproject or this file changes. torch is pinned to
# the CPU build; every plugin installs everywhere (its kernels load only where their
# ISA runs), editable, in one pip call so core's native-plugin markers resolve locally.
$(STAMP): core/pyproject.toml $(addsuffix pyproject.toml,$(PLUGINS)) Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip setuptools wheel
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet --no-build-isolation -e './core[dev]' $(addprefix -e ./,$(PLUGINS))
	touch $(STAMP)

demo: install
	$(VENV)/bin/glowlm generate --max-tokens 48 --repetition-penalty 1.2 --prompt 'def fibonacci(n):'

lint: install
	$(VENV)/bin/ruff check .

test: install lint
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

test-slow: install
	$(VENV)/bin/pytest -q -m slow $(PYTEST_ARGS)

BENCH_MODELS ?= .bench_models
$(BENCH_MODELS)/llama-1b-rand/config.json:
	$(PY) ../shared/bench/make_bench_models.py $(BENCH_MODELS)

bench-models: install $(BENCH_MODELS)/llama-1b-rand/config.json

# P1 (latency + roofline) and P2 (throughput) on the llama-1b shape, bf16 then fp32,
# with transformers on the same model and threads in the same run.
bench: bench-models
	for dt in bfloat16 float32; do \
	  $(VENV)/bin/glowlm bench roofline $(BENCH_MODELS)/llama-1b-rand --dtype $$dt --compare-hf; \
	  $(VENV)/bin/glowlm bench throughput $(BENCH_MODELS)/llama-1b-rand --dtype $$dt --compare-hf; \
	done

# The serving suite: benchmark/serving-tests-cpu.json -> benchmark/results/
# (DRY_RUN=1, MODEL_FILTER, DTYPE_FILTER, SERVING_JSON select what runs).
bench-suite: bench-models
	$(VENV)/bin/glowlm bench suite

clean:
	rm -rf $(VENV) build core/build plugins/*/build
