# Trainer images: local builds mirroring cloudbuild.yaml. Included by the top-level Makefile, which
# defines PYTHON, VENV_DIR and TOOLS_BIN (where hadolint is installed). Needs a Docker engine, except
# lint-docker. docs/images.md explains the images, their variants and how to run them.
#
#   make build-pytorch-cpu                       # one image (GPU: build-pytorch)
#   make build                                   # all six
#   make push PROJECT_ID=my-project TAG=v0.1.0   # build, then push to Artifact Registry
#   make cloudbuild PROJECT_ID=my-project        # the same on Cloud Build (cloudbuild.yaml)

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

IMAGES := pytorch tensorflow horovod
IMAGE_REFS := $(foreach i,$(IMAGES),$(REGISTRY)/$(i):$(TAG) $(REGISTRY)/$(i)-cpu:$(TAG))

# $(call image_build,<image>,<gpu|cpu>,<repository name>): the build cloudbuild.yaml runs for it.
image_build = DOCKER_BUILDKIT=1 $(DOCKER) build --file images/$(1)/Dockerfile \
	--build-arg VARIANT=$(2) \
	--build-arg REDUCTION_SERVER=$(if $(filter gpu,$(2)),$(REDUCTION_SERVER),0) \
	--build-arg VERSION=$(IMAGE_VERSION) --build-arg REVISION=$(IMAGE_REVISION) \
	$(DOCKER_BUILD_ARGS) --tag $(REGISTRY)/$(3):$(TAG) .

.PHONY: build build-pytorch build-pytorch-cpu build-tensorflow build-tensorflow-cpu \
	build-horovod build-horovod-cpu push cloudbuild lint-docker

build: build-pytorch build-pytorch-cpu build-tensorflow build-tensorflow-cpu build-horovod build-horovod-cpu

build-pytorch:
	$(call image_build,pytorch,gpu,pytorch)
build-pytorch-cpu:
	$(call image_build,pytorch,cpu,pytorch-cpu)
build-tensorflow:
	$(call image_build,tensorflow,gpu,tensorflow)
build-tensorflow-cpu:
	$(call image_build,tensorflow,cpu,tensorflow-cpu)
build-horovod:
	$(call image_build,horovod,gpu,horovod)
build-horovod-cpu:
	$(call image_build,horovod,cpu,horovod-cpu)

# Authenticate once: gcloud auth configure-docker $(REGION)-docker.pkg.dev
push: build
	for ref in $(IMAGE_REFS); do $(DOCKER) push "$$ref"; done

cloudbuild:
	gcloud builds submit --project=$(PROJECT_ID) --config=cloudbuild.yaml \
		--substitutions=_REGION=$(REGION),_REPOSITORY=$(REPOSITORY),_TAG=$(TAG),_VERSION=$(IMAGE_VERSION),_REVISION=$(IMAGE_REVISION),_REDUCTION_SERVER=$(REDUCTION_SERVER) .

lint-docker:
	@test -x $(HADOLINT) || { echo "no hadolint at $(HADOLINT): run 'make venv' (or set HADOLINT)" >&2; exit 1; }
	$(HADOLINT) --config .hadolint.yaml images/*/Dockerfile
