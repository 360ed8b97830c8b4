"""Structure of images/<name>/Dockerfile: pinned bases, non-root tini entrypoint, locks, smoke checks, labels.

Each rule the images promise (docs/images.md)
is checked on the parsed Dockerfile, for both build variants where the answer depends on VARIANT.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser

from entrypoint.planning import registry
from tests.containers.engine import catalog, common

pytestmark = pytest.mark.images

ROOT = Path(__file__).resolve().parents[2]
IMAGES = common.IMAGES  # images/<name>/Dockerfile
VARIANTS = ("gpu", "cpu")
SHELL = ["/bin/bash", "-euo", "pipefail", "-c"]
ENTRYPOINT = ["/usr/bin/tini", "-g", "--", "python", "-m", "entrypoint", "run"]
PINNED_REF = re.compile(r"[a-z0-9][a-z0-9./_-]*:[\w.-]+@sha256:[0-9a-f]{64}")
# The smoke check of each image: the planner runs, and the framework imports (Horovod: and is built right); each
# image's list is its image.toml's build_checks.
SMOKE = {image: catalog.image(image).build_checks for image in IMAGES}


# The CUDA base of a GPU build: ARG CUDA_IMAGE / CUDA_DEVEL_IMAGE=nvidia/cuda:<major>.<minor>.<patch>-...
CUDA_BASE = re.compile(r"^ARG CUDA_(?:DEVEL_)?IMAGE=nvidia/cuda:(\d+)\.\d+", re.MULTILINE)


def test_every_image_is_a_registered_frameworks() -> None:
    """images/<name>/Dockerfile and the frameworks' records (``Framework.image``) name the same images."""
    declared = {registry.get(name).image for name in registry.names()} - {None}
    assert declared == set(IMAGES) and IMAGES
    for image in IMAGES:  # and each folder's image.toml names the framework whose record names the image
        assert registry.get(catalog.image(image).framework).image == image


@pytest.mark.parametrize("name", [n for n in registry.names() if registry.get(n).image])
def test_a_frameworks_cuda_is_its_images(name: str) -> None:
    """``Framework.cuda_major`` (what job specs check GPUs against) is the CUDA the image's Dockerfile builds on."""
    framework = registry.get(name)
    majors = {int(m) for m in CUDA_BASE.findall((ROOT / "images" / str(framework.image) / "Dockerfile").read_text())}
    assert majors == {framework.cuda_major}


@dataclass
class Stage:
    """One FROM ... AS name block: its base (after ARG substitution) and its instructions."""

    name: str
    base: str
    instructions: list[dict[str, Any]] = field(default_factory=list)

    def values(self, instruction: str) -> list[str]:
        return [i["value"] for i in self.instructions if i["instruction"] == instruction]


def parse(image: str, variant: str = "gpu") -> tuple[DockerfileParser, list[Stage]]:
    """The Dockerfile of ``image`` split into stages, FROM lines resolved for ``variant``."""
    parser = DockerfileParser(str(ROOT / "images" / image / "Dockerfile"), build_args={"VARIANT": variant})
    bases = iter(parser.parent_images)  # FROM images in order, ARG defaults and build_args applied
    stages: list[Stage] = []
    for ins in parser.structure:
        if ins["instruction"] == "FROM":
            words = ins["value"].split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(name, next(bases)))
        elif stages and ins["instruction"] != "COMMENT":
            stages[-1].instructions.append(ins)
    return parser, stages


def global_args(parser: DockerfileParser) -> dict[str, str]:
    """ARG defaults declared before the first FROM."""
    args: dict[str, str] = {}
    for ins in parser.structure:
        if ins["instruction"] == "FROM":
            break
        if ins["instruction"] == "ARG" and "=" in ins["value"]:
            key, _, value = ins["value"].partition("=")
            args[key] = value
    return args


def external_base(stages: list[Stage], stage: Stage) -> str:
    """Follow a stage's FROM through earlier stages to the registry image it starts from."""
    names = {s.name: s for s in stages}
    base = stage.base
    while base in names:
        base = names[base].base
    return base


def instructions(image: str) -> list[dict[str, Any]]:
    return [i for i in DockerfileParser(str(ROOT / "images" / image / "Dockerfile")).structure
            if i["instruction"] != "COMMENT"]


@pytest.fixture(params=IMAGES)
def image(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_syntax_directive_is_the_first_line(image: str) -> None:
    first = (ROOT / "images" / image / "Dockerfile").read_text().splitlines()[0]
    assert first == "# syntax=docker/dockerfile:1"


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_base_is_pinned_by_tag_and_digest(image: str, variant: str) -> None:
    _, stages = parse(image, variant)
    names = {s.name for s in stages}
    external = [s.base for s in stages if s.base not in names]
    assert external
    for ref in external:
        assert PINNED_REF.fullmatch(ref), f"{image} ({variant}): FROM {ref} is not name:tag@sha256:digest"


@pytest.mark.parametrize("variant", VARIANTS)
def test_final_stage_runs_on_the_variants_runtime_base(image: str, variant: str) -> None:
    _, stages = parse(image, variant)
    base = external_base(stages, stages[-1])
    if variant == "gpu":
        assert base.startswith("nvidia/cuda:") and "-cudnn-runtime-" in base, base
    else:
        assert base.startswith("ubuntu:"), base


def test_devel_base_only_under_the_builder(image: str) -> None:
    _, stages = parse(image, "gpu")
    for stage in stages:
        if "-devel-" in external_base(stages, stage):
            assert stage.name.startswith(("build", "package")), f"devel base used by stage {stage.name}"


def test_no_latest_tag_in_from_or_arg_defaults(image: str) -> None:
    for ins in instructions(image):
        if ins["instruction"] in ("FROM", "ARG"):
            assert not re.search(r":latest\b", ins["value"]), ins["value"]


def test_no_apt_key(image: str) -> None:
    """Keys go to a signed-by keyring; the apt-key command (deprecated, trusts a key for every repo) never."""
    text = (ROOT / "images" / image / "Dockerfile").read_text()
    assert not re.search(r"\bapt-key(?![.\w])", text)  # the key's URL, .../apt-key.gpg, is fine


def test_apt_installs_skip_recommends_and_clean_lists_in_the_same_run(image: str) -> None:
    runs = [i["value"] for i in instructions(image) if i["instruction"] == "RUN"]
    installs = [r for r in runs if "apt-get install" in r]
    assert installs
    for run in installs:
        assert run.count("apt-get install") == run.count("apt-get install -y --no-install-recommends"), run
        assert "apt-get update" in run and "rm -rf /var/lib/apt/lists/*" in run, run


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_every_run_is_valid_bash(image: str) -> None:
    """No engine to build with, so at least the shell of every RUN must parse."""
    for ins in instructions(image):
        if ins["instruction"] == "RUN":
            script = re.sub(r"^(--\S+\s+)+", "", ins["value"])  # RUN --mount=... flags
            result = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True, check=False)
            assert result.returncode == 0, f"line {ins['startline'] + 1}: {result.stderr}"


def test_every_stage_that_runs_commands_uses_bash_strict_mode(image: str) -> None:
    _, stages = parse(image)
    for stage in stages:
        names = [i["instruction"] for i in stage.instructions]
        if "RUN" in names:
            assert "SHELL" in names and names.index("SHELL") < names.index("RUN"), stage.name
            assert all(json.loads(v) == SHELL for v in stage.values("SHELL")), stage.name


def test_venv_made_once_filled_and_trimmed_in_one_layer_and_copied_only_onto_another_base(image: str) -> None:
    """The empty venv is the shared first stage's (built once for every image); the builder installs the lock and
    trims it in the same layer (what slim_venv.sh removes is in no layer); the runtime starts from the builder, the
    venv in place, unless its builder has a base of its own (Horovod's compilers): then the venv is copied."""
    _, stages = parse(image)
    base = next(s for s in stages if s.name == "python-base")
    assert any("-m venv /opt/venv" in run for run in base.values("RUN"))
    builder = next(s for s in stages if s.name == "builder")
    assert any("images/slim_venv.sh /opt/venv" in run for run in builder.values("RUN"))
    installs = [run for stage in stages for run in stage.values("RUN") if re.search(r"pip install .*-r ", run)]
    runtime = stages[-1]
    if runtime.base == "builder":
        assert installs and all("images/slim_venv.sh /opt/venv" in run for run in installs), installs
        assert not [c for c in runtime.values("COPY") if "/opt/venv" in c]
    else:
        assert "--from=builder /opt/venv /opt/venv" in runtime.values("COPY")


def test_the_package_is_a_small_layer_of_its_own_after_the_venv(image: str) -> None:
    """Editing the package rebuilds a wheel and a small layer, never the venv layer (layer cache, disk)."""
    _, stages = parse(image)
    package = next(s for s in stages if s.name == "package")
    assert package.base == "builder"
    copies = stages[-1].values("COPY")
    if stages[-1].base != "builder":
        assert copies.index("--from=package /dist/ /tmp/dist/") > copies.index("--from=builder /opt/venv /opt/venv")
    assert "--from=package /dist/ /tmp/dist/" in copies
    assert any(re.search(r"pip install .*--no-deps /tmp/dist/\*\.whl", run) for run in stages[-1].values("RUN"))


def test_locks_of_this_image_are_copied_before_the_source(image: str) -> None:
    _, stages = parse(image)
    builder = next(s for s in stages if s.name == "builder")
    copies = builder.values("COPY")
    lock_copies = [i for i, c in enumerate(copies) if "requirements" in c]
    assert lock_copies
    for i in lock_copies:
        sources = copies[i].split()[:-1]
        assert sources, copies[i]
        for src in sources:
            assert re.fullmatch(rf"images/{image}/requirements(-cpu)?\.txt", src), src
    copied = {src for i in lock_copies for src in copies[i].split()[:-1]}
    assert copied == {f"images/{image}/requirements.txt", f"images/{image}/requirements-cpu.txt"}
    assert not [c for c in copies if c.startswith(("entrypoint/", "trainers/", "pyproject.toml"))]
    package = next(s for s in stages if s.name == "package")  # FROM builder: after the locks
    source = package.values("COPY")
    assert {"pyproject.toml README.md ./", "entrypoint/ entrypoint/", "trainers/ trainers/"} <= set(source)
    assert any(re.search(r"pip wheel .*--no-deps .*\.$", run) for run in package.values("RUN"))


def test_each_variant_installs_its_own_lock(image: str) -> None:
    _, stages = parse(image)
    builder = next(s for s in stages if s.name == "builder")
    install = next(run for run in builder.values("RUN") if "requirements" in run and "pip install" in run)
    assert "cpu" in install and "requirements-cpu.txt" in install and "requirements.txt" in install


def _chain(stages: list[Stage], name: str) -> tuple[str, list[tuple[str, str]]]:
    """The registry image a stage starts from and every instruction from there to the stage's end, as the engine's
    layer cache sees them (the stages' names and comments do not count)."""
    names = {s.name: s for s in stages}
    chain: list[Stage] = []
    while name in names:
        chain.insert(0, names[name])
        name = names[name].base
    return name, [(i["instruction"], i["value"]) for stage in chain for i in stage.instructions]


@pytest.mark.parametrize("image", [i for i in IMAGES if catalog.image(i).build_after])
def test_a_cpu_builder_built_after_another_image_starts_from_its_layers(image: str) -> None:
    """Horovod's CPU builder starts from a stage that repeats the TensorFlow image's builder up to its lock install,
    instruction for instruction on the same base, so that the layer cache holds it once that image is built (its
    build_after) and TensorFlow is installed once for both images (docs/images.md)."""
    _, stages = parse(image, "cpu")
    builder = next(s for s in stages if s.name == "builder")
    base, chain = _chain(stages, builder.base)
    for other in catalog.image(image).build_after:
        _, theirs = parse(other, "cpu")
        their_base, their_chain = _chain(theirs, "builder")
        lock = next(i for i, (kind, value) in enumerate(their_chain) if kind == "RUN" and "pip install" in value
                    and f"images/{other}/" in value)
        assert (base, chain) == (their_base, their_chain[:lock + 1]), f"{image}'s CPU builder is not {other}'s"

    _, gpu = parse(image, "gpu")  # the GPU variant is unchanged: its builder on the CUDA devel base, no other lock
    gpu_builder = next(s for s in gpu if s.name == "builder")
    assert "devel" in _chain(gpu, gpu_builder.base)[0] and _chain(gpu, gpu_builder.base)[1] == []


def test_final_user_is_not_root(image: str) -> None:
    parser, stages = parse(image)
    users = stages[-1].values("USER")
    assert users, "the runtime stage sets no USER"
    user = re.sub(r"\$\{(\w+)\}", lambda m: global_args(parser)[m.group(1)], users[-1]).split(":")[0]
    assert user not in ("root", "0"), user


def test_entrypoint_is_tini_running_the_entrypoint_package_in_exec_form(image: str) -> None:
    _, stages = parse(image)
    entrypoints = stages[-1].values("ENTRYPOINT")
    assert len(entrypoints) == 1
    assert json.loads(entrypoints[0]) == ENTRYPOINT


def test_runtime_environment(image: str) -> None:
    parser, _ = parse(image)
    env = dict(parser.envs)  # the final stage's ENV (base image ENV is not visible here)
    assert env["TRAINER_FRAMEWORK"] == image
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PATH"].startswith("/opt/venv/bin:")
    assert env["TINI_KILL_PROCESS_GROUP"] == "1"  # also for a command that runs tini itself (tini -- sh -c ...)
    if image == "tensorflow":
        assert env["TF_USE_LEGACY_KERAS"] == "1"


def test_build_time_smoke_check(image: str) -> None:
    _, stages = parse(image)
    runs = " ".join(stages[-1].values("RUN"))
    for needle in SMOKE[image]:
        assert needle in runs, needle


def test_horovod_is_built_with_nccl_ops_by_the_shared_script() -> None:
    _, stages = parse("horovod")
    builder = next(s for s in stages if s.name == "builder")
    build = next(run for run in builder.values("RUN") if "build_horovod_wheel.sh" in run)
    assert "images/horovod/build_horovod_wheel.sh /opt/venv/bin/python /wheels" in build
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in build
    assert "images/horovod/build_horovod_wheel.sh images/horovod/" in builder.values("COPY")
    assert external_base(stages, builder).startswith("nvidia/cuda:")


def test_reduction_server_is_optional_and_uses_a_signed_by_keyring(image: str) -> None:
    parser, stages = parse(image)
    assert global_args(parser)["REDUCTION_SERVER"] == "0"
    run = next(r for r in stages[-1].values("RUN") if "google-reduction-server" in r)
    assert 'if [ "${REDUCTION_SERVER}" = 1 ]' in run
    assert "gpg --dearmor -o /usr/share/keyrings/" in run
    assert "deb [signed-by=/usr/share/keyrings/" in run and "google-fast-socket main" in run


def test_oci_labels_come_last(image: str) -> None:
    parser, _ = parse(image)
    body = instructions(image)
    assert body[-1]["instruction"] == "LABEL"
    first_label = next(i for i, ins in enumerate(body)
                       if ins["instruction"] == "LABEL" and "org.opencontainers.image." in ins["value"])
    assert {ins["instruction"] for ins in body[first_label:]} == {"LABEL"}
    assert [ins["value"] for ins in body[first_label - 2:first_label]] == ["VERSION=0.1.0", "REVISION=unknown"]
    labels = parser.labels
    for key in ("title", "version", "revision"):
        assert labels.get(f"org.opencontainers.image.{key}"), key


def test_pip_tooling_pins_agree_with_the_locks(image: str) -> None:
    """setuptools/wheel installed before the lock must not contradict a pin in it."""
    parser, _ = parse(image)
    args = global_args(parser)
    for lock in (ROOT / "images" / image).glob("requirements*.txt"):
        pins = dict(line.split("==", 1) for line in lock.read_text().splitlines() if "==" in line)
        for package, arg in (("setuptools", "SETUPTOOLS_VERSION"), ("wheel", "WHEEL_VERSION")):
            if package in pins:
                assert pins[package] == args[arg], f"{lock.name}: {package}=={pins[package]}, {arg}={args[arg]}"


def test_every_copied_path_exists_and_is_in_the_build_context(image: str) -> None:
    allowed = [line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")]
    for ins in instructions(image):
        if ins["instruction"] != "COPY" or ins["value"].startswith("--from="):
            continue
        for src in ins["value"].split()[:-1]:
            assert (ROOT / src).exists(), f"COPY {src}: no such path"
            assert any(src.rstrip("/") == a or src.startswith(a + "/") for a in allowed), \
                f"COPY {src}: excluded by .dockerignore"


def test_gib_is_optional_gpu_only_and_uses_a_signed_by_keyring() -> None:
    """GIB=1 (PyTorch): Google's gIB packages from gpudirect-gib-apt (docs/fabric.md), after the venv so that
    the default keeps the venv's layer cached."""
    parser, stages = parse("pytorch")
    assert global_args(parser)["GIB"] == "0"
    runs = stages[-1].values("RUN")
    run = next(r for r in runs if "nccl-gib-plugins" in r)
    assert 'if [ "${GIB}" = 1 ]' in run and '[ "${VARIANT}" = gpu ]' in run
    assert "libibverbs1" in run and "test -f /usr/local/gib/scripts/set_nccl_env.sh" in run
    assert "deb [signed-by=/usr/share/keyrings/" in run and "gpudirect-gib-apt main" in run
    assert runs.index(run) > next(i for i, r in enumerate(runs) if "/tmp/dist/*.whl" in r)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_bill_of_materials_is_written_after_the_last_install_by_the_catalogs_one_line(image: str,
                                                                                         variant: str) -> None:
    """Every runtime stage has catalog.SBOM_LINE once, after everything that installs or copies software in and
    before USER (it writes as root): a document made earlier would miss what came after it (docs/images.md). A new
    image's Dockerfile gets the one line."""
    _, stages = parse(image, variant)
    runtime = stages[-1].instructions
    lines = [f"{i['instruction']} {i['value']}" for i in runtime]
    assert lines.count(catalog.SBOM_LINE) == 1, f"images/{image}/Dockerfile lacks the line: {catalog.SBOM_LINE}"
    where = lines.index(catalog.SBOM_LINE)
    installs = [n for n, i in enumerate(runtime) if i["instruction"] in ("COPY", "ADD")
                or (i["instruction"] == "RUN" and re.search(r"apt-get install|pip install|dpkg -i", i["value"]))]
    assert installs and max(installs) < where, f"{image}: something is installed after the bill of materials"
    user = next(n for n, i in enumerate(runtime) if i["instruction"] == "USER")
    assert where < user, f"{image}: the bill of materials is written as root, before USER"


def test_the_catalog_the_package_and_the_local_build_agree_on_where_the_bill_of_materials_is() -> None:
    from entrypoint.cluster.environments.settings import DEFAULT_SBOM
    from entrypoint.outputs.sbom import SBOM_PATH
    from tests.containers.engine import supply_chain

    assert catalog.SBOM_PATH == SBOM_PATH == DEFAULT_SBOM == supply_chain.SBOM_IN_IMAGE


def test_each_dockerfile_is_what_the_catalog_generates(image: str) -> None:
    """images/<name>/Dockerfile is its Dockerfile.in with the shared blocks (images/Dockerfile.blocks) placed: the
    stages every image shares are written once, and an image's own file holds only what is its own."""
    generated = catalog.dockerfile(catalog.image(image))
    assert generated is not None, f"images/{image}/{catalog.SOURCE} is missing"
    assert generated == (ROOT / "images" / image / "Dockerfile").read_text(), \
        f"images/{image}/Dockerfile is not current: python3 images/catalog.py dockerfiles"
    shared, todo, used = catalog.blocks(), [(ROOT / "images" / image / catalog.SOURCE).read_text()], set()
    while todo:
        for name in re.findall(r"^#@ ([\w-]+)", todo.pop(), re.MULTILINE):
            used.add(name)
            todo.append(shared[name])
    for name in ("args", "package", "reduction-server", "env", "sbom-user", "labels"):
        assert name in used, f"images/{image}/{catalog.SOURCE} does not use the shared block {name}"
    assert {"venv-and-package", "runtime-over-builder"} & used, f"images/{image}/{catalog.SOURCE} has no runtime block"


def test_every_shared_block_is_used() -> None:
    own = "".join((ROOT / "images" / name / catalog.SOURCE).read_text() for name in IMAGES)
    shared = catalog.blocks()
    used = set(re.findall(r"^#@ ([\w-]+)", own + "\n".join(shared.values()), re.MULTILINE))
    assert sorted(set(shared) - used) == []


@pytest.mark.parametrize(("line", "error"), [
    ("#@ nosuch", "no block 'nosuch'"), ("#@ labels", "takes an argument"), ("#@ env x", "takes no argument")])
def test_a_bad_block_line_is_one_error_naming_it(tmp_path: Path, line: str, error: str) -> None:
    (tmp_path / catalog.SOURCE).write_text(f"#@ top\n{line}\n")
    with pytest.raises(catalog.CatalogError, match=re.escape(error)) as caught:
        catalog.dockerfile(catalog.image("jax"), tmp_path)
    assert f"images/jax/{catalog.SOURCE}" in str(caught.value)
