# Trainer images: local builds mirroring cloudbuild.yaml. Included by the top-level Makefile, which
# defines PYTHON, VENV_DIR, TORCH_VENV and TOOLS_BIN (where hadolint is installed). Needs a Docker
# engine, except lint-docker and the image tests. docs/images.md explains the images and how to run them.
#
#   make build-pytorch-cpu                       # one image (GPU: build-pytorch)
#   make build                                   # all six
#   make push PROJECT_ID=my-project TAG=v0.1.0   # build, then push to Artifact Registry
#   make cloudbuild PROJECT_ID=my-project        # the same on Cloud Build (cloudbuild.yaml)
#   make image-test                              # the three CPU images built and run here (podman or Docker)
#   make image-clean                             # remove them, their local base and its layer cache

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

.PHONY: build $(BUILD_TARGETS) push cloudbuild lint-docker image-test test-images image-clean

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

lint-docker:
	@test -x $(HADOLINT) || { echo "no hadolint at $(HADOLINT): run 'make venv' (or set HADOLINT)" >&2; exit 1; }
	$(HADOLINT) --config .hadolint.yaml images/*/Dockerfile

# ---- image tests: the CPU variants built on this machine from the same Dockerfiles and locks ----------
# images/local_build.py makes a Debian bookworm base once (mmdebstrap), builds localhost/trainer-<image>:cpu
# with cloudbuild.yaml's CPU build arguments plus the local base, its Python and the wheel sources (torch's
# +cpu wheel; the Horovod wheel `make venv-horovod` cached, when its key is the image's: Horovod compiles
# once), and reports sizes against images/size-budget.json; tests/containers/ then runs the images. Layers
# and the base stay cached in the engine's storage: only a cold machine pays the full build.
image-test: venv-pytorch
	$(PYTHON) images/local_build.py build
	$(TORCH_VENV)/bin/python -m pytest -m containers tests/containers $(PYTEST_ARGS)

# Part of `make test`: installs podman where it can (root with apt-get). Without an engine: one line
# saying what to install, and the image tests are skipped; under CI=true that is a failure.
test-images:
	@status=0; $(PYTHON) images/local_build.py engine --install || status=$$?; \
	if [ $$status -eq 3 ]; then exit 0; fi; \
	if [ $$status -ne 0 ]; then exit $$status; fi; \
	$(MAKE) --no-print-directory image-test

image-clean:
	$(PYTHON) images/local_build.py clean
