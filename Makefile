# Local mirror of CI and of cloudbuild.yaml. `make test` and `make demo` set up their own
# virtual environments from the exact locks (images/<name>/requirements-cpu.txt + tests/requirements.txt).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
# The interpreter every venv is made from: the CPU images' own, the distribution's python3.11 (bookworm's, the local
# base's: built with profile-guided optimization and LTO, linked statically) where it is installed with its venv
# module, else python3.11, else $(PYTHON). A `--enable-shared` build without those optimizations (pyenv's default)
# runs the suite's Python about 12% slower: tests/pytorch/test_preemption.py took 70.7 s of CPU on pyenv's 3.11.7
# against 62.0 s on bookworm's 3.11.2, the same venv's packages (docs/testing.md).
ifeq ($(origin VENV_PYTHON),undefined)
VENV_PYTHON := $(or $(shell for p in /usr/bin/python3.11 python3.11; do \
	$$p -c 'import ensurepip, sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null && command -v $$p && break; done),$(PYTHON))
endif
VENV_DIR ?= .venv
TORCH_VENV := $(VENV_DIR)/pytorch
TF_VENV := $(VENV_DIR)/tensorflow
HVD_VENV := $(VENV_DIR)/horovod
JOBS_VENV := $(VENV_DIR)/jobs
BENCH_VENV := $(VENV_DIR)/bench
TOOLS_BIN ?= $(TORCH_VENV)/bin
PIP := pip --disable-pip-version-check
PYTEST_ARGS ?=
DEMO_DIR ?= demo-outputs
# `make test` (docs/testing.md): one `make -j` graph in which each tier waits only for what it needs, with its output
# in $(LOG_DIR)/<tier>.log, a line when it starts and ends, and its failures printed when it fails (tests/tiers.py).
LOG_DIR ?= test-logs
TEST_JOBS ?= 8
# Run alone (make test-pytorch), a tier also streams its output; make test turns that off (tiers side by side).
TIER_STREAM ?= --stream
TIER = $(PYTHON) tests/tiers.py run --log-dir $(LOG_DIR) $(TIER_STREAM)
# $(call bytecode,VENV): before a tier, remove the .pyc files of VENV and this checkout that a full disk cut short (they
# fail every later import of their module, in every run; tests/bytecode.py).
bytecode = $(1)/bin/python tests/bytecode.py
# pytest-xdist workers inside each tier (0: none, the tests run in pytest's own process). Tests go to a worker one at
# a time as it frees up (--maxschedchunk 1): xdist's default hands each worker a quarter of its share at once, and
# the multi-process tests, collected first, all went to the first worker, one after another (docs/testing.md).
# Each image's tier: XDIST_<IMAGE> (XDIST_PYTORCH ?= 5, ...), from its images/<name>/image.toml.
XDIST_CONTAINERS ?= 2
xdist = $(if $(filter-out 0,$(1)),-n $(1) --maxschedchunk 1)
# make test: at most this many multi-process tests (markers slow, containers) at once across all tiers and workers
# (tests/slots.py); the workers' unit tests run beside them. A tier run alone has no limit.
TEST_SLOTS ?= 3
# and this many more while the machine has idle CPU (tests/slots.py): once the other tiers have ended, the PyTorch
# tier's tests, which mostly wait on their jobs, used one core of two
TEST_SLOTS_EXTRA ?= 2
TIMED_LABEL ?= make test
# make test warns below this much free disk (venvs, images and test outputs take about 15 GiB)
TEST_MIN_FREE_GIB ?= 20
# make test ends with the tiers table and the tests that spent most CPU, their processes' included (tests/cputime.py)
TEST_CPU_TOP ?= 15

.DEFAULT_GOAL := help

# Every image is one folder (images/<name>/: its Dockerfile, locks and image.toml; images/catalog.py). The catalog's
# variables (IMAGE_NAMES, IMG_<name>_*) are written to $(IMAGES_MK) whenever an image.toml changes, and the templates
# below and in images/images.mk make each image's targets from them (venv-, test-, image-, build-<name>, the
# container tiers): an image is added by adding its folder.
IMAGES_MK := .build/images.mk
$(IMAGES_MK): images/catalog.py images/image_folders.py $(wildcard images/*/image.toml images/*/Dockerfile)
	@mkdir -p $(@D) && $(PYTHON) images/catalog.py make > $@.tmp && mv $@.tmp $@
include $(IMAGES_MK)

.PHONY: help venv $(addprefix venv-,$(IMAGE_NAMES)) venv-jobs lint lint-python test test-tiers test-lint test-timed test-load \
	$(addprefix test-,$(IMAGE_NAMES)) test-jobs demo demo-horovod venv-bench bench bench-quick test-bench clean

help:
	@echo "make demo   - 2-replica emulated Vertex AI cluster training the PyTorch digits example"
	@echo "make test   - lint, type checks and the whole test suite, side by side (sets up its own venvs)"
	@echo "make test-timed - make test, then its wall time, CPU use and what ran beside what (docs/testing.md)"
	@echo "make lint   - ruff, mypy and hadolint"
	@echo "make demo-horovod - the same training with Horovod (builds Horovod once, ~4 min on 2 cores)"
	@$(foreach i,$(IMAGE_NAMES),echo "make venv-$(i) - .venv/$(i): the $(i) image's Python, from its exact CPU lock (then . .venv/$(i)/bin/activate)";)
	@echo "make venv-jobs - .venv/jobs: .venv/pytorch + the job-spec SDKs the jobs tests check against (test-only)"
	@echo "make build  - build every image (needs a Docker engine); see docs/images.md"
	@echo "make image-test - build the three CPU images here (podman or Docker) and run them (part of make test)"
	@echo "make image-test-gpu - build the three GPU images here from the GPU locks (not part of make test)"

# One venv per image CPU lock, each with the test tools and this package (editable) on top.
# $(call lock_venv,VENV,LOCK): create VENV from the exact LOCK plus tests/requirements.txt, byte-compiled at install
# (about 25 s of CPU per lock on 2 cores). Not compiling it costs far more where PYTHONDONTWRITEBYTECODE is set (CI's
# machine): no import ever writes a .pyc, so every process compiled what it imported from source again (`import torch`
# 2.4 s of CPU instead of 1.1 s, in each of the suite's thousands of processes). uv installs the lock, from the sources
# pip's configuration names (tests/uv_flags.py): the same packages at the same pins as pip, for less CPU (empty caches:
# the PyTorch lock 48.7 s against 66.2 s, TensorFlow's 45.6 against 75.7, JAX's 34.9 against 59.6; docs/testing.md);
# the venv keeps its pip.
define lock_venv
	rm -rf $(1)
	$(VENV_PYTHON) -m venv $(1)
	$(UV) pip install -q --python $(1)/bin/python --compile-bytecode $$($(PYTHON) tests/uv_flags.py) -r $(2) -r tests/requirements.txt
endef

# uv, pinned, in a venv of its own (the image venvs are made with it; a fresh machine installs it in about 2 s of CPU).
# An order-only prerequisite: a venv already made (by pip or uv) is not made again because uv was installed.
UV_VERSION ?= 0.13.8
UV_VENV := $(VENV_DIR)/.uv
UV := $(UV_VENV)/bin/uv
$(UV_VENV)/.ready:
	rm -rf $(UV_VENV)
	$(VENV_PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/$(PIP) install -q uv==$(UV_VERSION)
	touch $@

# $(call venv_over,VENV,BASES,REQUIREMENTS): VENV sees everything installed in each venv of BASES (a .pth file per
# base adds its site-packages, its own .pth files, the editable install of this package included, processed), and
# installs only what REQUIREMENTS adds; its own packages come first on sys.path. Installing the PyTorch lock again
# took about a minute of CPU per venv on a fresh machine.
define venv_over
	rm -rf $(1)
	$(VENV_PYTHON) -m venv $(1)
	$(1)/bin/$(PIP) uninstall -q -y setuptools  # the one venv bundles would hide BASE's exact pin
	$(foreach b,$(2),echo "import site; site.addsitedir('$$($(b)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')')" \
		> "$$($(1)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_over_$(notdir $(b)).pth";)
	$(1)/bin/$(PIP) install -q -r $(3)
endef

# $(call image_venv,NAME): .venv/NAME from the image's CPU lock + tests/requirements.txt + this package (editable), or
# over other images' venvs ([venv] over) with only what its lock adds; then its own step ([venv] after), if any.
define image_venv
$(VENV_DIR)/$(1)/.ready: images/$(1)/requirements-cpu.txt $(if $(IMG_$(1)_OVER),$(foreach o,$(IMG_$(1)_OVER),$(VENV_DIR)/$(o)/.ready),tests/requirements.txt pyproject.toml) $(IMG_$(1)_AFTER) $(if $(IMG_$(1)_AFTER),$(wildcard images/$(1)/*.sh)) | $(if $(IMG_$(1)_OVER),,$(UV_VENV)/.ready)
	$(if $(IMG_$(1)_OVER),$$(call venv_over,$(VENV_DIR)/$(1),$(addprefix $(VENV_DIR)/,$(IMG_$(1)_OVER)),images/$(1)/requirements-cpu.txt),$$(call lock_venv,$(VENV_DIR)/$(1),images/$(1)/requirements-cpu.txt))
	$(if $(IMG_$(1)_OVER),,$(VENV_DIR)/$(1)/bin/$$(PIP) install -q --no-deps --no-build-isolation -e .)
	$(if $(IMG_$(1)_AFTER),bash $(IMG_$(1)_AFTER) $(VENV_DIR)/$(1))
	touch $$@
venv-$(1): $(VENV_DIR)/$(1)/.ready
endef
$(foreach i,$(IMAGE_NAMES),$(eval $(call image_venv,$(i))))

# Test-only: google-cloud-aiplatform and the Kubeflow training SDK check what `entrypoint job` writes. They are in
# no image lock; this venv is the PyTorch venv (the round trips run real replicas) plus their own exact lock.
$(JOBS_VENV)/.ready: $(TORCH_VENV)/.ready tests/requirements-jobs.txt
	$(call venv_over,$(JOBS_VENV),$(TORCH_VENV),tests/requirements-jobs.txt)
	$(JOBS_VENV)/bin/$(PIP) check
	touch $@

venv-jobs: $(JOBS_VENV)/.ready
venv: $(addprefix venv-,$(IMAGE_NAMES)) venv-jobs

lint-python: venv-pytorch
	$(TOOLS_BIN)/ruff check entrypoint trainers tests bench images/*.py
	$(TOOLS_BIN)/mypy
	$(TOOLS_BIN)/mypy --strict images/*.py  # on its own: images/<name>/ would shadow the frameworks
	$(TOOLS_BIN)/mypy --strict tests/tiers.py tests/diagnostics.py tests/slots.py tests/bytecode.py tests/cputime.py tests/tier_skips.py tests/uv_flags.py  # test infrastructure (docs/testing.md)

lint-docker: venv-pytorch
lint: lint-python lint-docker

# Each image's CPU lock gets the part of the suite that concerns it (-m its marker, [tests] in its image.toml; the
# catch-all tier, PyTorch's, also runs every test no other tier claims: unit, image-static, bench smoke), with
# pytest-xdist workers; pytest exits 5 when a marker selects nothing, which counts as a failure here. The PyTorch tier
# keeps Inductor's cache in the venv it was built for ([tests] env), so that a warm run does not compile the same
# kernels again. The container tests run after the image builds, in test-images (images/images.mk).
define image_tier
test-$(1): venv-$(1)
	@$$(call bytecode,$(VENV_DIR)/$(1)) && $(IMG_$(1)_ENV) $$(TIER) $(1) -- $(VENV_DIR)/$(1)/bin/python -m pytest \
		-m "$(IMG_$(1)_MARKER)$(if $(IMG_$(1)_CATCH_ALL), and not jobs and not containers)" $$(call xdist,$$($(IMG_$(1)_XDIST))) $$(PYTEST_ARGS)
endef
$(foreach i,$(IMAGE_NAMES),$(eval $(call image_tier,$(i))))

# Specs from `entrypoint job`, checked by google-cloud-aiplatform's and Kubeflow's own types, and run by local --spec.
test-jobs: venv-jobs
	@$(call bytecode,$(JOBS_VENV)) && $(TIER) jobs -- $(JOBS_VENV)/bin/python -m pytest -m jobs $(PYTEST_ARGS)

# Everything side by side (TEST_JOBS at once, and on past a failure: every tier reports), then the table of what
# ran when. The graph: the venvs build at once (the Horovod one once the TensorFlow one, which it sits over, is ready);
# lint and each tier start when their venv is ready; the PyTorch and TensorFlow images when podman and the base are;
# the Horovod image after venv-horovod, whose wheel it takes; the container tests after their images. Nothing is built
# twice.
test:
	@mkdir -p $(LOG_DIR); since=$$(date +%s); status=0; free=$$(df --output=avail -BG . | tail -1 | tr -dc 0-9); \
	[ "$$free" -ge $(TEST_MIN_FREE_GIB) ] || echo "make test: only $$free GiB free on disk (under $(TEST_MIN_FREE_GIB)): a disk \
	that fills cuts files short (.pyc, images, checkpoints) and fails tests; free space (podman image prune, make image-clean)"; \
	rm -rf $(LOG_DIR)/slots $(LOG_DIR)/test-cpu.jsonl; export TEST_SLOTS=$(TEST_SLOTS) TEST_SLOTS_EXTRA=$(TEST_SLOTS_EXTRA) \
		TEST_SLOTS_DIR=$(abspath $(LOG_DIR))/slots TEST_CPU_LOG=$(abspath $(LOG_DIR))/test-cpu.jsonl; \
	$(MAKE) --no-print-directory -k -j$(TEST_JOBS) TIER_STREAM= test-tiers || status=$$?; \
	echo "make test: $$([ $$status -eq 0 ] && echo passed || echo FAILED) (logs in $(LOG_DIR)/):"; \
	$(PYTHON) tests/tiers.py table --log-dir $(LOG_DIR) --since $$since --cpu $(TEST_CPU_TOP); exit $$status

test-tiers: $(addprefix test-,$(IMAGE_NAMES)) test-images test-jobs test-lint

test-lint: venv-pytorch
	@$(TIER) lint -- $(MAKE) --no-print-directory lint

# `make test` measured: wall time, CPU use, and the tiers table (docs/testing.md), in $(LOG_DIR)/timing.md.
test-timed:
	$(PYTHON) tests/tiers.py measure --log-dir $(LOG_DIR) --label "$(TIMED_LABEL)" -- $(MAKE) --no-print-directory test

# Green under load: `make test` LOAD_RUNS times in a row with a busy loop on LOAD_HOGS core(s) beside it, each
# measured (appended to $(LOG_DIR)/timings.md); stops at the first red run.
LOAD_RUNS ?= 3
LOAD_HOGS ?= 1
test-load:
	for run in $$(seq 1 $(LOAD_RUNS)); do \
		$(PYTHON) tests/tiers.py measure --log-dir $(LOG_DIR) --hog $(LOAD_HOGS) \
			--label "under load ($(LOAD_HOGS) busy loop), run $$run of $(LOAD_RUNS)" -- $(MAKE) --no-print-directory test; \
	done

# A real distributed training: 2 replicas of an emulated Vertex AI cluster (chief + worker, DDP over gloo); the README's
# PyTorch quick start runs the same command (tests/readme/test_readme.py checks they are the same).
demo: venv-pytorch
	rm -rf $(DEMO_DIR)
	$(TORCH_VENV)/bin/python -m entrypoint local --workers 2 --output-dir $(DEMO_DIR) -- \
		run --framework pytorch --module trainers.digits_torch --hypertune-metric accuracy

# The same digits training with Horovod: 2 replicas meeting through Horovod's gloo rendezvous, no ssh.
demo-horovod: venv-horovod
	rm -rf $(DEMO_DIR)-horovod
	$(HVD_VENV)/bin/python -m entrypoint local --workers 2 --output-dir $(DEMO_DIR)-horovod -- \
		run --framework horovod --module trainers.digits_horovod --hypertune-metric accuracy

# Benchmarks (not part of `make test`; docs/benchmarks.md): .venv/bench = the PyTorch venv (venv_over) +
# bench/requirements.txt (matplotlib, exact pins). `make bench` runs every family side by side (~30 min on 2 cores),
# the Horovod and TensorFlow ones in their own venvs, and rewrites docs/benchmarks.md; results in bench/results/.
$(BENCH_VENV)/.ready: $(TORCH_VENV)/.ready bench/requirements.txt
	$(call venv_over,$(BENCH_VENV),$(TORCH_VENV),bench/requirements.txt)
	$(BENCH_VENV)/bin/$(PIP) check
	touch $@

venv-bench: $(BENCH_VENV)/.ready

BENCH_PYTHONS = --python horovod=$(HVD_VENV)/bin/python --python tensorflow=$(TF_VENV)/bin/python
BENCH_ARGS ?=

bench: venv-bench venv-horovod venv-tensorflow
	$(BENCH_VENV)/bin/python -m bench --update-docs $(BENCH_PYTHONS) $(BENCH_ARGS)

# Every family at smoke-test size (a few minutes); writes bench/results/ only.
bench-quick: venv-bench venv-horovod venv-tensorflow
	$(BENCH_VENV)/bin/python -m bench --quick $(BENCH_PYTHONS) $(BENCH_ARGS)

# The benchmark smoke test with the plot (matplotlib is in .venv/bench only; `make test` runs it without the plot).
test-bench: venv-bench
	$(BENCH_VENV)/bin/python -m pytest tests/bench $(PYTEST_ARGS)

clean:
	rm -rf $(VENV_DIR) $(DEMO_DIR) $(LOG_DIR) .build outputs .pytest_cache .mypy_cache .ruff_cache

-include images/images.mk
