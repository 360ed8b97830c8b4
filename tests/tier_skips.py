"""A tier's own test module skipped at collection is a failure of that tier, not one more skip (docs/testing.md).

Every tier collects the whole suite, and the modules of the other tiers skip at import (``pytest.importorskip``:
no TensorFlow in the PyTorch venv), so a skipped module is nothing unusual. But a module the tier's marker
expression selects (``-m``: ``tensorflow`` for the TensorFlow tier; the catch-all tier's ``not horovod and not
tensorflow ...`` for the PyTorch one) that skips says its own venv lacks what it needs: TensorFlow missing from the
TensorFlow venv would otherwise pass that tier with its tests skipped among the others'. Which markers a module
carries is read from its source (``pytest.mark.NAME``): a skipped module never ran its ``pytestmark`` line. Without
``-m`` (a developer's run of some files) nothing changes.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

_MARK = re.compile(r"\bpytest\.mark\.([A-Za-z_]\w*)")


def markers_in(source: str) -> set[str]:
    """The marker names a module's source applies (``pytest.mark.NAME`` anywhere in it)."""
    return set(_MARK.findall(source))


def selected(markexpr: str, markers: set[str]) -> bool:
    """Whether ``-m markexpr`` selects a test carrying ``markers``."""
    def carries(name: str, /, **_kwargs: str | int | bool | None) -> bool:
        return name in markers

    return Expression.compile(markexpr).evaluate(carries)


def own_module_skipped(markexpr: str, path: Path, reason: str) -> str | None:
    """Why a module skipped at collection fails this run (the tier's expression selects it), else None."""
    if not markexpr or path.suffix != ".py":
        return None
    try:
        markers = markers_in(path.read_text(encoding="utf-8"))
    except OSError:
        return None
    if not selected(markexpr, markers):
        return None
    return (f"{path}: this tier's own test module (-m {markexpr!r} selects its markers {sorted(markers)}) was skipped "
            f"at collection ({reason}): its venv lacks what it needs; install it, or mark the module for the tier "
            "that has it")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, pytest.CollectReport,
                                                                         pytest.CollectReport]:
    report = yield
    if report.skipped and isinstance(collector, pytest.Module):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        problem = own_module_skipped(str(collector.config.getoption("markexpr") or ""), collector.path,
                                     str(reason).removeprefix("Skipped: "))
        if problem is not None:
            report.outcome = "failed"
            report.longrepr = problem
    return report
