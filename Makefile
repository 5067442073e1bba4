# The stable entry point for people, CI and tools. See README.md.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
STAMP   := $(VENV)/.glowlm-installed
PLUGINS := $(sort $(dir $(wildcard plugins/*/pyproject.toml)))
PYTEST_ARGS ?=

.PHONY: install demo test test-slow lint bench bench-models bench-suite peers bench-peers clean

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

# llama.cpp as a same-run peer (docs/peers.md). llama-cpp-python is compiled from its
# PyPI source for this CPU (a build of some 8 minutes on 2 cores, hence its own stamp
# and its own venv). That venv is layered over $(VENV) by a .pth, so the peer sees
# glowlm, torch and transformers (GGUF conversion) while $(VENV) itself stays untouched.
PEERS_VENV ?= .venv-peers
LLAMA_CPP_PYTHON ?= 0.3.36
PEERS_SRC  := $(PEERS_VENV)/src/llama_cpp_python-$(LLAMA_CPP_PYTHON)
PEERS_STAMP := $(PEERS_VENV)/.peers-installed
PURELIB    := import sysconfig; print(sysconfig.get_paths()["purelib"])

peers: install $(PEERS_STAMP)

$(PEERS_STAMP): | $(STAMP)
	test -x $(PEERS_VENV)/bin/python || $(PY) -m venv $(PEERS_VENV)
	echo "import site; site.addsitedir('$$($(PY) -c '$(PURELIB)')')" \
	  > "$$($(PEERS_VENV)/bin/python -c '$(PURELIB)')/glowlm-venv.pth"
	mkdir -p $(PEERS_VENV)/src
	test -f $(PEERS_SRC).tar.gz || $(PEERS_VENV)/bin/pip download --quiet --no-deps \
	  --no-binary :all: -d $(PEERS_VENV)/src llama-cpp-python==$(LLAMA_CPP_PYTHON)
	tar -xzf $(PEERS_SRC).tar.gz -C $(PEERS_VENV)/src
	CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
	  $(PEERS_VENV)/bin/pip install $(PEERS_SRC).tar.gz
	$(PEERS_VENV)/bin/pip install --quiet sentencepiece $(PEERS_SRC)/vendor/llama.cpp/gguf-py
	$(PEERS_VENV)/bin/python -c 'import glowlm, gguf, llama_cpp; print("llama-cpp-python", llama_cpp.__version__)'
	touch $(PEERS_STAMP)

# P1 and P2 of llama.cpp on the llama-1b shape at bf16, f16 and f32 GGUF (converted once
# into $(BENCH_MODELS)/gguf/), each beside glowlm at the same dtype, in the same run.
bench-peers: peers bench-models
	$(PEERS_VENV)/bin/python tools/bench_peers.py $(BENCH_MODELS)/llama-1b-rand \
	  --dtype bf16 f16 f32 --glowlm

clean:
	rm -rf $(VENV) build core/build plugins/*/build
