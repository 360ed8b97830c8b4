"""An empty evaluation set is named once (a warning on the chief), not only an empty metrics line every epoch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runs import entrypoint, failure_text, summary

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
WARNING = "the evaluation set (build_datasets' second dataset) is empty"


def test_an_empty_evaluation_set_is_warned_about_once(tmp_path: Path) -> None:
    proc = entrypoint("run", "--framework", "pytorch", "--job-dir", str(tmp_path), "--module",
                      "tests.pytorch.empty_eval_hooks", "--nproc-per-node", "2", "--timeout", "60")
    assert proc.returncode == 0, failure_text(proc)
    output = proc.stdout + proc.stderr
    assert output.count(WARNING) == 1, output[-3000:]
    assert summary(tmp_path / "model")["metrics"] == {}
