"""Run the locally built CPU images (make image-test) with the same engine settings the builds use.

The engine, its flags and the image names come from images/local_build.py and its modules (build_common,
container_engine, debian_base, wheel_sources, image_sizes, cuda_base, build_inputs, catalog, supply_chain, vuln_gate),
loaded from images/
(standalone scripts, not a package). Containers get unique names and are always removed.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import ROOT


def _load(*names: str) -> list[ModuleType]:
    """Import the local build's modules from images/, which is on sys.path only meanwhile: left there, its
    images/<name>/ folders would answer `import tensorflow` or `import horovod` as namespace packages."""
    folder = str(ROOT / "images")
    sys.path.insert(0, folder)
    try:
        return [importlib.import_module(name) for name in names]
    finally:
        sys.path.remove(folder)


driver, common, engines, base, wheels, sizes, cuda, inputs, catalog, supply_chain, vuln_gate = _load(
    "local_build", "build_common", "container_engine", "debian_base", "wheel_sources", "image_sizes", "cuda_base",
    "build_inputs", "catalog", "supply_chain", "vuln_gate")
Engine = engines.Engine
UID = 1000  # the images' trainer user (TRAINER_UID)
JOB_TIMEOUT = 300  # seconds for one containerised job; each takes 10-60 s on 2 idle cores
OUT = "/outputs"  # where a test mounts its output volume in the container
PROGRESS = re.compile(r"\bstep (\d+)/(\d+)\b")


def unavailable(reason: str) -> None:
    """Skip, except in CI, where the image tests must run (make test installs the engine there)."""
    if common.is_ci():
        pytest.fail(f"{reason} (CI=true: the image tests may not be skipped)")
    pytest.skip(reason)


def writable_dir(path: Path) -> Path:
    """A host directory the container's uid 1000 can write (what users do: chown 1000 or chmod)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    return path


def files_under(path: Path) -> list[str]:
    """Every file below ``path``, relative, sorted (directories alone do not count)."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def vertex_spec(ports: Sequence[int], pool: str = "workerpool0") -> str:
    """The CLUSTER_SPEC Vertex AI gives the first replica of ``pool``: a chief (workerpool0) on the first
    port, and a worker (workerpool1) on the second when there is one."""
    cluster = {f"workerpool{i}": [f"127.0.0.1:{port}"] for i, port in enumerate(ports)}
    return json.dumps({"cluster": cluster, "task": {"type": pool, "index": 0}, "environment": "cloud"})


def aip_dirs(root: str = OUT) -> dict[str, str]:
    """The output variables Vertex AI sets, pointing into the mounted volume."""
    return {"AIP_MODEL_DIR": f"{root}/model", "AIP_CHECKPOINT_DIR": f"{root}/checkpoints",
            "AIP_TENSORBOARD_LOG_DIR": f"{root}/logs"}


@dataclass
class Container:
    """One ``run`` of an image: its command line, and (once started) its process and output file."""

    engine: Any  # container_engine.Engine
    image: str
    args: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    volumes: Mapping[Path, str] = field(default_factory=dict)  # host path -> "container path[:ro]"
    entrypoint: str | None = None
    name: str = field(default_factory=lambda: f"trainer-test-{uuid.uuid4().hex[:10]}")
    log: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    def command(self, *run_flags: str) -> list[str]:
        flags = [*run_flags, "--name", self.name, *self.engine.run_flags()]
        for key, value in self.env.items():
            flags += ["--env", f"{key}={value}"]
        for host, inside in self.volumes.items():
            flags += ["--volume", f"{host}:{inside}"]
        if self.entrypoint is not None:
            flags += ["--entrypoint", self.entrypoint]
        return self.engine.command("run", *flags, common.image_ref(self.image), *self.args)

    def start(self, log: Path) -> Container:
        """Start in the background, stdout and stderr to ``log``."""
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT)
        return self

    def wait(self, timeout: float = JOB_TIMEOUT) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log and self.log.exists() else ""

    def wait_for_output(self, pattern: re.Pattern[str], timeout: float = JOB_TIMEOUT) -> re.Match[str]:
        """Poll the output until ``pattern`` appears (or the container ends, or the deadline passes)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = pattern.search(self.output())
            if match:
                return match
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"{self.name}: no {pattern.pattern!r} in its output\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return f"[{self.name}]\n" + "\n".join(self.output().splitlines()[-lines:])

    def remove(self) -> None:
        """Kill and remove the container if it still exists."""
        for action in (("kill",), ("rm", "--force")):
            subprocess.run(self.engine.command(*action, self.name), capture_output=True, timeout=120, check=False)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def run(container: Container, timeout: float = JOB_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run a container to completion (removed afterwards), output captured."""
    try:
        return subprocess.run(container.command("--rm"), capture_output=True, text=True, timeout=timeout, check=False)
    finally:
        container.remove()


@contextmanager
def started(*containers: Container, logs: Path) -> Iterator[tuple[Container, ...]]:
    """Start containers in the background; whatever happens, none is left behind."""
    try:
        for container in containers:
            container.start(logs / f"{container.name}.log")
        yield containers
    finally:
        for container in containers:
            container.remove()
