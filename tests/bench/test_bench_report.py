"""The benchmark suite's own logic, without running any benchmark: interleaving, ratios, targets, the table."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.common import FamilyResult, check, compare, interleave, timed
from bench.gpu import mfu_row, peak_tflops
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


def test_a_command_past_its_timeout_is_killed_not_left_running_into_the_next_measurement(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    with pytest.raises(RuntimeError, match="did not finish within 3 s"):
        timed([([sys.executable, "-c", code], dict(os.environ))], timeout=3)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:  # gone (timed() also reaped it)
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()


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


def test_mfu_is_per_device() -> None:
    runs = [{"tokens_per_second": 1000.0, "flops_per_token": 1e9, "world_size": 2},
            {"tokens_per_second": 1000.0, "flops_per_token": 1e9}]  # world 1 when not said
    assert mfu_row("sharded", runs, peak=1.0).runs == [50.0, 100.0]


def test_checkpoint_targets_are_on_asynchronous_saves_at_100m_parameters() -> None:
    pytest.importorskip("torch")
    from bench.checkpoint import rows_of

    seconds = {"ours sharded sync (FSDP)": [(6.0, 6.0)], "ours sharded async (FSDP)": [(0.5, 5.0), (0.4, 5.0)],
               "DCP async_save (FSDP)": [(1.5, 5.0)], "DCP save": [(2.0, 2.0)]}
    rows = rows_of("110M", seconds, 110_000_000)
    assert [(r.variant, r.met) for r in rows] == [("ours sharded sync (FSDP)", None),
                                                  ("ours sharded async (FSDP)", True),
                                                  ("DCP async_save (FSDP)", False), ("DCP save", None)]
    assert rows[1].median == 0.45 and rows[1].ratio == 0.09 and rows[1].target == "<= 0.1"
    assert all(r.met is None for r in rows_of("1M", seconds, 1_000_000))
    nan = float("nan")
    remote = {"ours async gs://": [(nan, nan), (0.2, 4.0)], "ours sync gs://": [(nan, nan)]}
    rows = rows_of("110M", remote, 110_000_000, {"ours async gs://": ["HttpError: 400"], "ours sync gs://": ["x"]})
    assert (rows[0].runs, rows[0].ratio, rows[0].met) == ([0.2], 0.05, True)
    assert rows[0].note.endswith("; 1 save(s) failed (counting warm-up), the last: HttpError: 400")
    assert (rows[1].runs, rows[1].ratio, rows[1].met) == ([], None, None)


def _training_job(rank0: float, rank1: float, rise: float | None = None) -> dict[str, Any]:
    return {"ranks": {0: rank0, 1: rank1}, "whole": {0: rank0 + 1, 1: rank1 + 1}, "strategy": "fsdp",
            "timing": {"seconds": 4.0, "timed_steps": 2, "export_rise_mib": rise, "largest_tensor_mib": 100.0,
                       "tensors": 3, "tensors_mib": 300.0, "export_rss_before_mib": 1000.0, "export_seconds": 1.0}}


def test_memory_compares_the_larger_rank_and_the_export_rise_with_the_largest_tensor() -> None:
    from bench.memory import MALLOCS, training_rows

    default, fixed = MALLOCS
    runs = {f"ddp, {default}": [_training_job(2600, 2700)], f"fsdp, {default}": [_training_job(2500, 2400, 190)],
            f"ddp, {fixed}": [_training_job(2600, 2500)], f"fsdp, {fixed}": [_training_job(1500, 1510, 120)]}
    rows = training_rows(runs, MALLOCS, "100m", 3)
    assert [(r.median, r.ratio, r.met) for r in rows] == [(2700, 1.0, None), (2500, 0.9259, False),
                                                          (2600, 1.0, None), (1510, 0.5808, True),
                                                          (190, 1.9, False), (120, 1.2, True)]
    assert rows[4].target == "<= largest + 32 MiB" and "ranks 2500 / 2400 MiB" in rows[1].note
    assert all(r.met is None for r in training_rows(runs, MALLOCS, "tiny", 2))  # targets only at ~100M


def test_the_sharded_gpt_row_is_per_device_and_says_what_ran() -> None:
    from bench.gpu import sharded_row

    runs = [{"tokens_per_second": 400.0, "world_size": 2, "strategy": "fsdp", "compile_seconds": 30.0},
            {"tokens_per_second": 300.0, "world_size": 1, "strategy": "default",
             "strategy_reason": "--strategy fsdp on a single process: nothing to shard"}]
    row = sharded_row("fsdp", runs[:1], bare=100.0, cuda=True)
    assert (row.median, row.ratio, row.group, row.note) == (400.0, 2.0, "sharded, world 2",
                                                             "ran as fsdp; compiling took 30 s")
    row = sharded_row("fsdp", runs[1:], bare=100.0, cuda=True)
    assert row.ratio == 3.0 and "ran as default (--strategy fsdp on a single process" in row.note


def test_chaos_rows_hold_each_strategy_to_its_goodput_target() -> None:
    from bench.chaos import VARIANTS, row_of
    from bench.node_jobs import NodeRun

    report = {"goodput_percent": 81.234, "buckets": {"productive": 90.0, "recovery": 12.0, "startup": 0.2},
              "disruption_count": 3, "steps": {"lost": 7}}
    run = NodeRun(110.0, stalls=[4.0, 6.0, 5.0], kills=3, goodput=report)
    rows = {name: row_of(name, run, target, "300 steps") for name, (_, _, target) in VARIANTS.items()}
    assert rows["HSDP (in place)"].met is True and rows["HSDP (in place)"].target == ">= 80%"
    assert rows["DDP (in place)"].met is False and rows["DDP (in place)"].target == ">= 87.8%"
    assert rows["FSDP (restart from storage)"].median == 81.23
    assert "3 kill(s), 3 disruption(s) in the ledger, 7 step(s) lost" in rows["HSDP (in place)"].note
    assert "median 5.0" in rows["HSDP (in place)"].note and "{'recovery': 12.0}" in rows["HSDP (in place)"].note


def test_a_stall_ends_at_a_restarted_chiefs_step_a_rolled_back_step_or_two_steps_past_the_kill() -> None:
    from bench.node_jobs import new_training

    killed = (100.0, 37, "")  # the chief had logged step 37 of its first attempt
    assert not new_training(killed, "", 38)  # 38 was in flight at the kill
    assert new_training(killed, "", 39)  # in place: the survivors train again
    assert new_training(killed, "", 31) and new_training(killed, "", 37)  # every rank rolled back to a peer snapshot
    assert new_training(killed, "#1", 31)  # restarted from the checkpoint at 30
    assert not new_training((100.0, 31, "#1"), "#1", 32) and new_training((100.0, 31, "#1"), "#2", 1)


def test_a_chaos_job_that_fails_is_a_failed_row_with_its_last_words_not_a_lost_family() -> None:
    from bench.chaos import failed_row

    error = RuntimeError("local ... exited 1:\n[workerpool0-0] entrypoint: error: peer_lost on workerpool0-0\n"
                         "[local] workerpool0-0 exited 129 (retryable): restart 4 of 1000\nnoise")
    row = failed_row("FSDP (in place, peer memory)", error, 80.0, "1000 steps")
    assert (row.met, row.median, row.target) == (False, 0.0, ">= 80%")
    assert "the job failed: local ... exited 1:" in row.note and "error: peer_lost" in row.note
    assert "restart 4 of 1000" in row.note and "noise" not in row.note
