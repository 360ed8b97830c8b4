"""Uninterrupted reference runs, run once per pytest run and shared by every test (and xdist worker) that needs one.

A recovery test compares its interrupted job with the same job never interrupted. Several tests need the same
uninterrupted job (the digits fault module at world 1 or 2, say): each ran it again, a few seconds of CPU each time.
``reference(factory, name, args)`` runs ``python -m entrypoint ARGS`` once, in a directory shared by the run's
workers (the parent of each xdist worker's base temp), under a file lock: the first test to ask runs it, the others
wait for it and read its outputs. A reference that failed fails every test that asks for it, with its output.

``args`` is a function of the output directory; the arguments, with that directory left out, are the key: two tests
that ask under one name with other arguments get an error, not each other's run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.runs import entrypoint, failure_text

OUT = "{out}"  # stands for the output directory in a reference's key


def shared_root(factory: pytest.TempPathFactory) -> Path:
    """The directory every worker of this pytest run sees: the base temp, or its parent under xdist."""
    base = factory.getbasetemp()
    root = base.parent if base.name.startswith("popen-gw") else base
    folder = root / "references"
    folder.mkdir(exist_ok=True)
    return folder


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class Reference:
    out: Path  # the output directory: read it, never write to it (copy it to run on from it)
    stdout: str


def reference(factory: pytest.TempPathFactory, name: str, args: Callable[[Path], list[str]],
              timeout: float = 600) -> Reference:
    """``python -m entrypoint args(out)``, run to exit 0 once per pytest run: its output directory and stdout."""
    folder = shared_root(factory)
    key = json.dumps(args(Path(OUT)))
    out, done = folder / name, folder / f"{name}.json"
    with _locked(folder / f"{name}.lock"):
        if done.exists():
            record = json.loads(done.read_text())
            assert record["key"] == key, f"reference {name!r} was run with other arguments: {record['key']}"
            assert record["exit"] == 0, f"reference {name!r} failed:\n{record['output']}"
            return Reference(out, record["stdout"])
        proc = entrypoint(*args(out), timeout=timeout)
        done.write_text(json.dumps({"key": key, "exit": proc.returncode, "output": failure_text(proc),
                                    "stdout": proc.stdout}))
        assert proc.returncode == 0, failure_text(proc)
    return Reference(out, proc.stdout)


FAULTS = ["--framework", "pytorch", "--module", "tests.pytorch.faults", "--log-every", "2", "--timeout", "120"]


def faults_digest(factory: pytest.TempPathFactory, world: int) -> str:
    """The final parameters' digest of ``tests.pytorch.faults`` never interrupted: one process (``run``) at world 1,
    ``local`` replicas of one process each above. Checkpoint cadence, step sleeps, timeouts and restart policies do
    not change the weights, so every recovery test of that module compares with this one run."""
    if world == 1:
        def args(out: Path) -> list[str]:
            return ["run", *FAULTS, "--job-dir", str(out)]
    else:
        def args(out: Path) -> list[str]:
            return ["local", "--workers", str(world), "--output-dir", str(out), "--", "run", *FAULTS]
    out = reference(factory, f"faults-world-{world}", args).out
    return str(json.loads((out / "model" / "training_summary.json").read_text())["param_digests"][0])
