"""The benchmark suite's own logic, without running any benchmark: interleaving, ratios, targets, the table."""

from __future__ import annotations

from bench.common import FamilyResult, check, compare, interleave
from bench.gpu import peak_tflops
from bench.report import markdown


def test_interleave_rotates_the_order_and_drops_warmup_rounds() -> None:
    calls: list[str] = []
    values = iter(range(100))

    def variant(name: str) -> float:
        calls.append(name)
        return float(next(values))

    results = interleave({n: (lambda n=n: variant(n)) for n in "ABC"}, repeats=3, warmup=1)
    assert "".join(calls) == "ABC" "BCA" "CAB" "ABC"
    assert results == {"A": [5.0, 7.0, 9.0], "B": [3.0, 8.0, 10.0], "C": [4.0, 6.0, 11.0]}


def test_compare_and_check_give_ratios_and_targets() -> None:
    rows = compare("world 1", {"bare": [1.0, 3.0, 2.0], "ours": [2.1, 2.0, 2.2]}, "s", "bare", "x bare")
    assert [r.median for r in rows] == [2.0, 2.1] and rows[1].ratio == 1.05
    check(rows[1], "<=", 1.05)
    assert rows[1].met is True and rows[1].target == "<= 1.05"
    check(rows[1], ">=", 0.98, against=0.5, label="throughput ")
    assert rows[1].met is False and rows[1].target == "throughput >= 0.98"


def test_peaks_match_the_specific_name_first() -> None:
    def peak(name: str) -> float | None:
        found = peak_tflops(name)
        return None if found is None else found[0]

    assert peak("NVIDIA H100 80GB HBM3") == 989.0 and peak("NVIDIA H100 PCIe") == 756.0
    assert peak("NVIDIA H100 NVL") == 835.0 and peak("NVIDIA H200") == 989.0
    assert peak("NVIDIA A100-SXM4-80GB") == 312.0 and peak("NVIDIA A10") == 125.0
    assert peak("NVIDIA L40S") == 362.0 and peak("NVIDIA L4") == 121.0
    assert peak("NVIDIA A10G") is None and peak("Tesla T4") is None


def test_markdown_lists_targets_and_skipped_families() -> None:
    rows = compare("world 1", {"bare": [1.0], "ours": [1.2]}, "s", "bare", "x bare")
    check(rows[1], "<=", 1.05)
    results = [FamilyResult("launch", "Launch overhead", rows=rows, environment={"torch": "2.13.0"}, seconds=3),
               FamilyResult("tensorflow", "tensorflow", skipped="needs .venv/tensorflow")]
    machine = {"cpu": "Test CPU", "cores": 2, "usable_cores": 2, "memory_gib": 4.0, "os": "Linux", "gpus": [],
               "load_average": [0.1, 0.1, 0.1], "load_average_after": [0.2, 0.2, 0.2]}
    text = markdown(results, machine, "2026-01-01 00:00 UTC", quick=False, image=None)
    assert "| launch | world 1 | ours | 1.2 x bare | <= 1.05 | **no** |" in text
    assert "Not run: needs .venv/tensorflow" in text
    assert "Test CPU, 2 cores" in text and "torch 2.13.0" in text
