"""``python -m bench --quick`` end to end for the PyTorch families: the table, the raw JSON and the plot are written.

No timing is asserted here (figures belong in benchmarks): only that every family ran and reported rows.
The plot needs matplotlib, which only .venv/bench has (`make test-bench`); elsewhere it runs with --no-plot.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT, subprocess_env
from tests.tiers import children_cpu

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
FAMILIES = ("launch", "loop", "checkpoint", "collectives", "memory", "gpt")
# Its limit is a CPU budget, not its wall time: on a fresh machine with the image builds beside it the same run took
# more than 540 s of wall time. It spent about 95 s of CPU on a quiet machine (50 processes; 7 fewer since), and 390 s
# in a fresh `make test` under load whose venv had no .pyc (every process compiled torch's modules again); the budget
# is twice that, to catch a family that spins, not a busy machine. The wall limit only catches a hang.
CPU_BUDGET = 800
WALL_LIMIT = 1800


@pytest.mark.timeout(WALL_LIMIT + 60)
def test_quick_suite_writes_table_json_and_plot(tmp_path: Path) -> None:
    cpu_before = children_cpu()
    plot = importlib.util.find_spec("matplotlib") is not None
    docs = ROOT / "docs" / "benchmarks.md"
    before = docs.read_bytes() if docs.exists() else None
    cmd = [PYTHON, "-m", "bench", "--quick", "--only", ",".join(FAMILIES), "--out", str(tmp_path),
           "--python", "horovod=none", "--python", "tensorflow=none", *([] if plot else ["--no-plot"])]
    proc = subprocess.run(cmd, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=WALL_LIMIT)
    cpu = children_cpu() - cpu_before
    assert cpu < CPU_BUDGET, f"the quick benchmark took {cpu:.0f} s of CPU (budget {CPU_BUDGET} s)"
    summary = [line for line in proc.stdout.splitlines() if line.startswith("[bench]")]
    assert proc.returncode == 0, "\n".join(summary) + "\n" + proc.stdout[-6000:] + proc.stderr[-3000:]

    (table,) = tmp_path.glob("*-quick.md")
    (raw,) = tmp_path.glob("*-quick.json")
    results = json.loads(raw.read_text())
    assert [f["name"] for f in results["families"]] == list(FAMILIES)
    for family in results["families"]:
        assert not family["skipped"], family
        assert family["rows"] and all(r["runs"] for r in family["rows"]), family["name"]
        assert family["environment"]["torch"]
    text = table.read_text()
    assert "| family | group | variant | measured | target | met |" in text
    assert all(f"### {f['title']}" in text for f in results["families"])
    assert results["machine"]["cores"] >= 1 and results["machine"]["cpu"] in text
    pngs = list(tmp_path.glob("*-quick.png"))
    if plot:
        assert len(pngs) == 1 and pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({pngs[0].name})" in text
    else:
        assert not pngs
    assert (docs.read_bytes() if docs.exists() else None) == before  # only --update-docs rewrites the docs
