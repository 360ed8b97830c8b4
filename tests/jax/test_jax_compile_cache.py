"""JAX's persistent compilation cache kept in the job dir: a rerun (a restart on a fresh disk) reuses what the first
attempt compiled instead of compiling it again (entrypoint/jax/distributed.py, docs/jax.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runs import entrypoint, failure_text

pytest.importorskip("jax")  # the JAX venv's; the other tiers collect this module and skip it
pytestmark = [pytest.mark.jax, pytest.mark.slow]
HOOKS = ("run", "--framework", "jax", "--module", "tests.jax.tiny_hooks", "--timeout", "120", "--log-every", "8")


def test_a_rerun_loads_the_compiled_steps_from_the_job_dir(tmp_path: Path) -> None:
    proc = entrypoint(*HOOKS, "--epochs", "1", "--job-dir", str(tmp_path))
    assert proc.returncode == 0, failure_text(proc)
    cache = tmp_path / "compile_cache" / "jax"
    first = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert any(name.startswith("jit_train_step-") for name in first), sorted(first)
    rerun = entrypoint(*HOOKS, "--epochs", "2", "--job-dir", str(tmp_path))  # resumes at step 32, trains 32 more
    assert rerun.returncode == 0, failure_text(rerun)
    assert "resumed at step 32" in rerun.stdout + rerun.stderr
    again = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    # the same computations found in the cache, not compiled and written again
    assert {name: again[name] for name in first} == first
