# Local mirror of CI and of cloudbuild.yaml. `make test` and `make demo` set up their own
# virtual environments from the exact locks (images/<name>/requirements-cpu.txt + tests/requirements.txt).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV_DIR ?= .venv
TORCH_VENV := $(VENV_DIR)/pytorch
TF_VENV := $(VENV_DIR)/tensorflow
TOOLS_BIN ?= $(TORCH_VENV)/bin
PIP := pip --disable-pip-version-check
PYTEST_ARGS ?=
DEMO_DIR ?= demo-outputs

.DEFAULT_GOAL := help
.PHONY: help venv venv-pytorch venv-tensorflow lint lint-python test test-pytorch test-tensorflow demo clean

help:
	@echo "make demo   - 2-replica emulated Vertex AI cluster training the PyTorch digits example"
	@echo "make test   - lint, type checks and the whole test suite (sets up its own venvs)"
	@echo "make lint   - ruff, mypy and hadolint"
	@echo "make build  - build every image (needs a Docker engine); see docs/images.md"

# One venv per image CPU lock, each with the test tools and this package (editable) on top.
$(TORCH_VENV)/.ready: images/pytorch/requirements-cpu.txt tests/requirements.txt pyproject.toml
	rm -rf $(TORCH_VENV)
	$(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/$(PIP) install -q -r images/pytorch/requirements-cpu.txt -r tests/requirements.txt
	$(TORCH_VENV)/bin/$(PIP) install -q --no-deps --no-build-isolation -e .
	touch $@

venv-pytorch: $(TORCH_VENV)/.ready
venv: venv-pytorch

lint-python: venv-pytorch
	$(TOOLS_BIN)/ruff check entrypoint trainers tests
	$(TOOLS_BIN)/mypy

lint: lint-python lint-docker

test-pytorch: venv-pytorch
	$(TORCH_VENV)/bin/python -m pytest -m "not tensorflow and not horovod" $(PYTEST_ARGS)

test: lint test-pytorch

# A real distributed training: 2 replicas of an emulated Vertex AI cluster (chief + worker, DDP over gloo).
demo: venv-pytorch
	rm -rf $(DEMO_DIR)
	$(TORCH_VENV)/bin/python -m entrypoint local --workers 2 --output-dir $(DEMO_DIR) -- \
		run --framework pytorch --module trainers.digits_torch --hypertune-metric accuracy

clean:
	rm -rf $(VENV_DIR) $(DEMO_DIR) outputs .pytest_cache .mypy_cache .ruff_cache

-include images/images.mk
