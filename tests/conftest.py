"""Shared fixtures: every test starts from an environment with no cluster variables (and leaks none)."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path

import pytest

from entrypoint.cluster import envvars

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = [
    "tests.gcs",  # the `emulator` fixture: a GCS server for the gs:// tests
    "tests.diagnostics",  # a failed test reports its processes' output by replica and its failure records
    "tests.slots",  # TEST_SLOTS: at most that many multi-process tests at once across make test's tiers
    "tests.cputime",  # TEST_CPU_LOG: each test's CPU time, its processes' included
    "tests.tier_skips",  # a tier's own module skipped at collection fails the tier (its venv lacks a dependency)
]
_PREFIXES = ("OMPI_", "PMI_", "PET_", "HOROVOD_", "AIP_", "CLOUD_ML_", "TORCHELASTIC_", "TRAINER_")
CLUSTER_VARS = tuple(
    sorted({v for n in dir(envvars) if n.isupper() and isinstance(v := getattr(envvars, n), str)}
           | {"ROLE_RANK", "ROLE_WORLD_SIZE"})
)


# A suite started in the background of a non-interactive shell (make -j, nohup, CI) inherits SIGINT ignored, and
# so would every process a test starts: a Python child (the GCS emulator) then never sees Ctrl-C and keeps serving
# after a test "stopped" it. Tests send SIGINT as a user's Ctrl-C would reach a foreground job: restore its default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _cluster_names() -> list[str]:
    return [n for n in os.environ if n in CLUSTER_VARS or n.startswith(_PREFIXES)]


@pytest.fixture(autouse=True)
def clean_cluster_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove every cluster variable for the test; monkeypatch restores them afterwards."""
    for name in _cluster_names():
        if name != "CUDA_VISIBLE_DEVICES":
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CPU unless a test says otherwise


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A child environment: this one minus cluster variables, plus ``extra``; our package importable."""
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARS and not k.startswith(_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""
    # `make test` runs up to five jobs at once on two cores: one CPU is each job's share (`local` divides it among
    # its replicas, at least one each). Without it every process starts an OpenMP pool as wide as the machine and
    # the pools spin against each other: a two-replica job took 4x the CPU on two busy cores (docs/testing.md).
    env["TRAINER_CPUS"] = "1"
    # And one Inductor compile thread, for the same reason: torch sizes a --compile process's compile pool (a process
    # that imports torch, and its workers) by the host's CPUs, not the job's share, and compiles in-process at 1. The
    # FSDP compile test (2 ranks) took 52-54 s of CPU with the pool, 45 s without; the kernels and caches are the same.
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    # No test asks a real metadata server for the platform's advance notice (a CI VM on GCE has one): a closed port
    # here; the tests of the notice give their fake server's address (tests/metadata.py).
    env["GCE_METADATA_HOST"] = "127.0.0.1:9"
    env.update(extra or {})
    return env


PYTHON = sys.executable


def skip_unless_installed(*names: str) -> None:
    """At a test module's top: skip the module (at collection, as ``pytest.importorskip`` does) where one of these
    packages is not installed, without importing it. Every xdist worker of every tier collects every module, and
    importing TensorFlow there cost each of them 4.7 s of CPU (gcsfs 0.7 s); the tests that use one import it."""
    module = sys._getframe(1).f_globals.get("__name__", "?")  # the skip's report shows this helper's line
    for name in names:
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{module}: could not import {name!r}: not installed", allow_module_level=True)


UNKNOWN_SECONDS = 10.0  # a multi-process test not on record yet (a new one): about a typical one


def run_order(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """Multi-process tests (``slow``, ``containers``) first, the longest first by ``seconds`` (a test not on record
    is taken for a typical one), then the rest in their usual order."""
    from tests.slots import is_heavy  # here, not at the top: pytest registers tests.slots as a plugin first

    def key(item: pytest.Item) -> tuple[bool, float]:
        heavy = is_heavy(item)
        return (not heavy, -seconds.get(item.nodeid, UNKNOWN_SECONDS) if heavy else 0.0)

    return sorted(items, key=key)


def pytest_configure(config: pytest.Config) -> None:
    """Each image's test marker (images/<name>/image.toml [tests] marker: its tier, make test-<name>), registered
    here from the image folders, so that a new image's folder brings its marker (pytest runs --strict-markers)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("images_catalog", ROOT / "images" / "catalog.py")
    assert spec is not None and spec.loader is not None
    catalog = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("images_catalog", catalog)  # tests/readme/test_readme.py reads the image list from it
    # its parts (image_folders.py, ...) are imported by plain name from images/, on sys.path only meanwhile: left
    # there, images/<name>/ would answer `import horovod` as a namespace package (tests/containers/engine.py, _load)
    folder = str(ROOT / "images")
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(catalog)
    finally:
        sys.path.remove(folder)
    for image in catalog.images():
        config.addinivalue_line("markers", f"{image.marker}: a test of the {image.name} image's tier, run in its venv "
                                           f"(.venv/{image.name}; images/{image.name}/image.toml)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The run order (``run_order``) by each test's wall time in a recorded run (tests/durations.json, written by
    `python3 tests/tiers.py durations`). With pytest-xdist handing out one test at a time (`make test` passes
    ``--maxschedchunk 1``; xdist's default chunks would give them all to the first worker) the long ones start at
    once and the many short ones fill the workers' gaps at the end, instead of a long test starting last and running
    alone. The order comes from a committed file, so it is the same on every worker, as xdist requires."""
    from tests.tiers import read_durations

    items[:] = run_order(items, read_durations())
