# Trainer images: local builds mirroring cloudbuild.yaml. Included by the top-level Makefile, which
# defines PYTHON, VENV_DIR, TORCH_VENV, TOOLS_BIN (where hadolint is installed) and includes the catalog's variables
# (IMAGE_NAMES, IMG_<name>_*, CONTAINER_GROUPS: images/catalog.py reads every images/<name>/image.toml). Needs a Docker
# engine, except lint-docker and the image tests. docs/images.md explains the images and how to run them.
#
#   make build-pytorch-cpu                       # one image (GPU: build-pytorch)
#   make build                                   # all six
#   make push PROJECT_ID=my-project TAG=v0.1.0   # build, then push to Artifact Registry
#   make cloudbuild PROJECT_ID=my-project        # the same on Cloud Build (cloudbuild.yaml)
#   make cloudbuild-sbom PROJECT_ID=my-project   # then attach each image's bill of materials in Artifact Registry
#   make image-test                              # the three CPU images built and run here (podman or Docker)
#   make image-test-gpu                          # the three GPU images built here (not part of make test)
#   make image-clean                             # remove them, their local bases and their layer cache

REGION ?= us-central1
PROJECT_ID ?= my-project
REPOSITORY ?= trainers
TAG ?= dev
REGISTRY ?= $(REGION)-docker.pkg.dev/$(PROJECT_ID)/$(REPOSITORY)
# Provenance labels (org.opencontainers.image.version/revision); evaluated only when used.
IMAGE_VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# 1: GPU images get the Google Reduction Server NCCL plugin.
REDUCTION_SERVER ?= 0
DOCKER ?= docker
DOCKER_BUILD_ARGS ?=
HADOLINT ?= $(TOOLS_BIN)/hadolint

# Every images/<name>/Dockerfile is an image (images/build_common.py derives the same list).
IMAGES := $(sort $(patsubst images/%/Dockerfile,%,$(wildcard images/*/Dockerfile)))
IMAGE_REFS := $(foreach i,$(IMAGES),$(REGISTRY)/$(i):$(TAG) $(REGISTRY)/$(i)-cpu:$(TAG))
BUILD_TARGETS := $(foreach i,$(IMAGES),build-$(i) build-$(i)-cpu)

# $(call image_build,<image>,<gpu|cpu>,<repository name>): the build cloudbuild.yaml runs for it.
image_build = DOCKER_BUILDKIT=1 $(DOCKER) build --file images/$(1)/Dockerfile \
	--build-arg VARIANT=$(2) \
	--build-arg REDUCTION_SERVER=$(if $(filter gpu,$(2)),$(REDUCTION_SERVER),0) \
	--build-arg VERSION=$(IMAGE_VERSION) --build-arg REVISION=$(IMAGE_REVISION) \
	$(DOCKER_BUILD_ARGS) --tag $(REGISTRY)/$(3):$(TAG) .

.PHONY: build $(BUILD_TARGETS) push cloudbuild cloudbuild-sbom lint-docker image-test test-images image-clean \
	image-engine image-base $(addprefix image-,$(IMAGE_NAMES)) test-containers \
	$(addprefix test-containers-,$(CONTAINER_GROUPS)) image-test-gpu

build: $(BUILD_TARGETS)

# build-<image> (GPU) and build-<image>-cpu for every image.
define image_targets
build-$(1):
	$$(call image_build,$(1),gpu,$(1))
build-$(1)-cpu:
	$$(call image_build,$(1),cpu,$(1)-cpu)
endef
$(foreach i,$(IMAGES),$(eval $(call image_targets,$(i))))

# Authenticate once: gcloud auth configure-docker $(REGION)-docker.pkg.dev
push: build
	for ref in $(IMAGE_REFS); do $(DOCKER) push "$$ref"; done

cloudbuild:
	gcloud builds submit --project=$(PROJECT_ID) --config=cloudbuild.yaml \
		--substitutions=_REGION=$(REGION),_REPOSITORY=$(REPOSITORY),_TAG=$(TAG),_VERSION=$(IMAGE_VERSION),_REVISION=$(IMAGE_REVISION),_REDUCTION_SERVER=$(REDUCTION_SERVER) .

# After `make cloudbuild`: attach each pushed image's bill of materials (uploaded by the build to
# gs://$(PROJECT_ID)_cloudbuild/sbom/$(TAG)/) to the image in Artifact Registry (gcloud artifacts sbom load).
SBOM_DIR ?= .build/sbom/$(TAG)
cloudbuild-sbom:
	mkdir -p $(SBOM_DIR) && gcloud storage cp "gs://$(PROJECT_ID)_cloudbuild/sbom/$(TAG)/*.cdx.json" $(SBOM_DIR)/
	for ref in $(IMAGE_REFS); do name=$${ref##*/}; \
		gcloud artifacts sbom load --project=$(PROJECT_ID) --source=$(SBOM_DIR)/$${name%%:*}.cdx.json --uri=$$ref || exit 1; done

lint-docker:
	@test -x $(HADOLINT) || { echo "no hadolint at $(HADOLINT): run 'make venv' (or set HADOLINT)" >&2; exit 1; }
	$(HADOLINT) --config .hadolint.yaml images/*/Dockerfile

# ---- image tests: the CPU variants built on this machine from the same Dockerfiles and locks ----------
# images/local_build.py makes a Debian bookworm base once (mmdebstrap), builds localhost/trainer-<image>:cpu
# with cloudbuild.yaml's CPU build arguments plus the local base, its Python and the wheel sources (torch's
# +cpu wheel; the Horovod wheel `make venv-horovod` cached: Horovod compiles once, so the Horovod image waits
# for that venv), and reports sizes against each image's budget (image.toml); tests/containers/ then runs the images:
# those of the PyTorch and TensorFlow images as soon as these are built, the Horovod ones after its image. Layers
# and the base stay cached in the engine's storage: only a cold machine pays the full build. Each step is a make
# target, so `make test` (-j) builds the images beside the test tiers.
#
# image-engine installs podman where it can (root with apt-get). Without an engine: one line saying what to
# install, and the image builds and tests are skipped; under CI=true that is a failure.
ENGINE_STATE = $(LOG_DIR)/engine.state
HAVE_ENGINE = test "$$(cat $(ENGINE_STATE) 2>/dev/null)" != none
CONTAINER_TESTS = $(TORCH_VENV)/bin/python -m pytest -m containers tests/containers $(call xdist,$(XDIST_CONTAINERS)) \
	$(PYTEST_ARGS)

image-engine:
	@mkdir -p $(LOG_DIR); status=0; $(PYTHON) images/local_build.py engine --install || status=$$?; \
	if [ $$status -eq 3 ]; then echo none > $(ENGINE_STATE); exit 0; fi; \
	if [ $$status -ne 0 ]; then exit $$status; fi; echo found > $(ENGINE_STATE)

image-base: image-engine
	@$(HAVE_ENGINE) || exit 0; $(PYTHON) images/local_build.py base

# image-<name> for every image (the catalog's IMAGE_NAMES, included by the Makefile): after the base, after its
# venv where the build takes what that venv made ([venv] build_needs_venv: Horovod's wheel), and after the images
# whose layers a stage of its Dockerfile starts from (build_after: Horovod's CPU builder is the TensorFlow image's).
define image_rule
image-$(1): image-base $(if $(IMG_$(1)_BUILD_NEEDS_VENV),venv-$(1)) $(addprefix image-,$(IMG_$(1)_BUILD_AFTER))
	@$$(HAVE_ENGINE) || exit 0; $$(TIER) image-$(1) -- $$(PYTHON) images/local_build.py build $(1)
endef
$(foreach i,$(IMAGE_NAMES),$(eval $(call image_rule,$(i))))

# test-containers-<group>: the container tests of a group's images ([tests] containers in their image.toml), after
# those images: the default group's tier (`containers`) runs every container test that names no other group's image.
define container_tier
test-containers-$(1): venv-pytorch $(addprefix image-,$(CONTAINER_$(1)_IMAGES))
	@$$(HAVE_ENGINE) || { echo "no container engine: the container tests are skipped"; exit 0; }; \
	$$(TIER) $(CONTAINER_$(1)_TIER) -- $$(CONTAINER_TESTS) $(if $(CONTAINER_$(1)_SELECT),-k "$(CONTAINER_$(1)_SELECT)")
endef
$(foreach g,$(CONTAINER_GROUPS),$(eval $(call container_tier,$(g))))

test-containers: $(addprefix test-containers-,$(CONTAINER_GROUPS))
image-test: test-containers
test-images: image-test  # the part of `make test`

# The GPU variants, built here once in a while (not in `make test`: several GB of CUDA wheels from PyPI): on the
# local Debian base with the GPU locks (proving they resolve), Horovod compiled with NCCL operations on a CUDA
# devel base made from PyPI's CUDA 13.0 wheels (images/cuda_base.py). Each build's smoke check, then a container
# per image, report torch's CUDA version, torchvision's ops, Horovod's NCCL ops and TensorFlow's CUDA build; the
# sizes are checked against the GPU budget in each images/<name>/image.toml.
image-test-gpu: image-base
	@$(HAVE_ENGINE) || { echo "no container engine: $@ needs podman or Docker" >&2; exit 1; }
	$(PYTHON) images/local_build.py build --gpu

image-clean:
	$(PYTHON) images/local_build.py clean
