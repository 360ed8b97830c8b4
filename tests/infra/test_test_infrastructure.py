"""The test infrastructure of `make test` (docs/testing.md): tests/tiers.py (a tier logged, timed and reported),
tests/diagnostics.py (a failed test says where to look), tests/slots.py (a limit on multi-process tests) and
tests/bytecode.py (a .pyc cut short is removed before a tier runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import bytecode, diagnostics, slots, tiers
from tests.conftest import ROOT, subprocess_env


def test_a_failed_tier_prints_its_failures_records_its_times_and_keeps_its_exit_code(tmp_path: Path) -> None:
    script = ("print('collected'); print('=' * 5 + ' FAILURES ' + '=' * 5); print('___ test_x ___'); "
              "print('E  assert 1 == 2'); print('=' * 3 + ' 1 failed, 2 passed in 0.1s ' + '=' * 3); "
              "raise SystemExit(1)")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "tiers.py"), "run", "demo", "--log-dir", str(tmp_path),
                           "--", sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[tiers] demo: FAILED (exit 1)" in proc.stdout and "1 failed, 2 passed" in proc.stdout
    assert "[demo] E  assert 1 == 2" in proc.stdout and "[demo] collected" not in proc.stdout  # the failures only
    (record,) = [json.loads(line) for line in (tmp_path / "tiers.jsonl").read_text().splitlines()]
    assert record["tier"] == "demo" and record["exit"] == 1 and record["wall"] >= 0 and record["cpu"] >= 0
    assert (tmp_path / "demo.log").read_text().startswith("collected\n")


def test_the_table_says_what_ran_beside_what() -> None:
    records = [{"tier": "a", "start": 0.0, "end": 100.0, "wall": 100.0, "cpu": 50.0, "exit": 0, "result": None},
               {"tier": "b", "start": 10.0, "end": 20.0, "wall": 10.0, "cpu": 5.0, "exit": 1, "result": "1 failed"},
               {"tier": "c", "start": 100.0, "end": 130.0, "wall": 30.0, "cpu": 5.0, "exit": 0, "result": None}]
    rows = tiers.tier_table(records)
    assert rows[2] == "| a | 0m00s | 1m40s | 1m40s | 0m50s | b | passed |"
    assert rows[3] == "| b | 0m10s | 0m20s | 0m10s | 0m05s | a | **failed (1)**: 1 failed |"
    assert rows[4].startswith("| c | 1m40s | 2m10s |") and "| - |" in rows[4]


def test_a_failed_test_reports_its_processes_by_replica_and_its_failure_records(tmp_path: Path) -> None:
    test = tmp_path / "test_demo.py"
    test.write_text(
        "import json, subprocess, sys\n"
        "def test_demo(tmp_path):\n"
        "    (tmp_path / 'job' / 'failures').mkdir(parents=True)\n"
        "    (tmp_path / 'job' / 'failures' / '1.json').write_text(json.dumps({'replica': 'workerpool1-0', "
        "'class': 'peer_lost', 'exit_code': 129, 'message': 'lost workerpool0'}))\n"
        "    p = subprocess.Popen([sys.executable, '-c', \"print('[workerpool0-0] chief says hi'); "
        "print('[workerpool1-0] worker says bye')\"], stdout=subprocess.PIPE, text=True)\n"
        "    lines = [line for line in p.stdout]\n"
        "    assert p.wait() == 0 and len(lines) == 2  # the test reads its pipe as usual\n"
        "    assert False\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", str(test), "-q", "-p", "no:cacheprovider",
                           "-p", "tests.diagnostics", "--rootdir", str(tmp_path)],
                          cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout
    assert "where to look: the 1 process(es) the test started, by replica" in proc.stdout
    assert "--- [workerpool0-0]: 1 lines" in proc.stdout and "[workerpool1-0] worker says bye" in proc.stdout
    assert "job/failures/1.json: workerpool1-0 rank None step None: peer_lost exit 129: lost workerpool0" in proc.stdout


def test_replica_tails_keep_the_last_lines_of_each_replica() -> None:
    lines = [f"[workerpool0-0] {i}" for i in range(50)] + ["[local] workerpool1-0 exited 137"]
    shown = diagnostics.replica_tails(lines)
    assert shown[0] == "--- [workerpool0-0]: 50 lines, the last 30" and shown[1] == "[workerpool0-0] 20"
    assert shown[-2:] == ["--- [local]: 1 lines", "[local] workerpool1-0 exited 137"]


def test_one_slot_is_held_by_one_test_at_a_time(tmp_path: Path) -> None:
    inside: list[int] = []
    overlaps: list[int] = []

    def hold() -> None:
        with slots.slot(tmp_path, 1):
            inside.append(1)
            overlaps.append(len(inside))
            time.sleep(0.3)
            inside.pop()

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert overlaps == [1, 1, 1]
    assert sorted(os.listdir(tmp_path)) == ["queue", "slot-0"]


def test_a_test_giving_its_slot_back_queues_behind_one_already_waiting(tmp_path: Path) -> None:
    order: list[str] = []
    waiting = threading.Event()

    def waiter() -> None:
        waiting.set()
        with slots.slot(tmp_path, 1):
            order.append("waiter")

    with slots.slot(tmp_path, 1):  # the first test of a busy tier
        thread = threading.Thread(target=waiter)
        thread.start()
        waiting.wait(10)
        time.sleep(3 * slots.POLL)  # the waiter holds the queue and polls for the slot
    with slots.slot(tmp_path, 1):  # the same tier's next test, asking again at once
        order.append("next")
    thread.join(timeout=30)
    assert order == ["waiter", "next"]


class FakeStat:
    """/proc/stat as the slots read it: (busy, total) jiffies, ``idle`` of every 100 idle, per call."""

    def __init__(self, idle: int) -> None:
        self.idle, self.now = idle, (0, 0)

    def __call__(self) -> tuple[int, int]:
        self.now = (self.now[0] + 100 - self.idle, self.now[1] + 100)
        return self.now


def test_an_extra_slot_opens_only_while_the_machine_idles_and_one_per_cooldown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slots, "WINDOW", 0.0)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    got: list[str] = []

    def ask(limit: float) -> None:
        def take() -> None:
            with slots.slot(tmp_path, 1, extra=2):
                got.append("slot")
                time.sleep(limit + 1)
        thread = threading.Thread(target=take, daemon=True)
        thread.start()
        thread.join(timeout=limit)

    with slots.slot(tmp_path, 1):  # the base slot is taken
        monkeypatch.setattr(slots, "cpu_jiffies", FakeStat(idle=20))  # 0.4 of a core idle: busy
        ask(1.0)
        assert got == []
        monkeypatch.setattr(slots, "cpu_jiffies", FakeStat(idle=50))  # a whole core idle
        ask(2.0)
        assert got == ["slot"] and (tmp_path / "extra-granted").exists()
        ask(1.0)  # idle still, but within the cooldown of the one just handed out
        assert got == ["slot"]


def test_the_machine_idle_reads_between_zero_and_every_core() -> None:
    before = slots.cpu_jiffies()
    time.sleep(0.3)
    assert 0 <= slots.idle_cores(before, slots.cpu_jiffies()) <= (os.cpu_count() or 1)


def test_a_pyc_cut_short_breaks_every_import_until_bytecode_removes_it(tmp_path: Path) -> None:
    (tmp_path / "victim.py").write_text("VALUE = 'x' * 10\n" + "def f():\n    return VALUE\n" * 50)
    env = {**subprocess_env(), "PYTHONPATH": str(tmp_path)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    load = [sys.executable, "-c", "import victim; print(victim.f())"]
    assert subprocess.run(load, env=env, capture_output=True, timeout=60).returncode == 0  # writes the .pyc
    (pyc,) = (tmp_path / "__pycache__").glob(f"victim.{sys.implementation.cache_tag}.pyc")
    pyc.write_bytes(pyc.read_bytes()[:40])  # what a short write on a full disk leaves: the header, part of the body
    broken = subprocess.run(load, env=env, capture_output=True, text=True, timeout=60)
    assert broken.returncode == 1 and "marshal data too short" in broken.stderr
    assert bytecode.heal([tmp_path], sys.implementation.cache_tag) == [pyc] and not pyc.exists()
    assert subprocess.run(load, env=env, capture_output=True, timeout=60).returncode == 0
    assert bytecode.heal([tmp_path], sys.implementation.cache_tag) == []  # rewritten whole by that import


def test_each_test_records_its_cpu_with_its_processes_and_the_table_shows_the_costliest(tmp_path: Path) -> None:
    (tmp_path / "test_burn.py").write_text(
        "import subprocess, sys\n"
        "def test_burns_in_a_child():\n"
        "    subprocess.run([sys.executable, '-c', 'import time\\nend = time.process_time() + 0.5\\n"
        "while time.process_time() < end: pass'], check=True)\n"
        "def test_idle():\n    pass\n")
    log = tmp_path / "test-cpu.jsonl"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.cputime", "-p", "no:cacheprovider",
                           str(tmp_path / "test_burn.py")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=subprocess_env({"TEST_CPU_LOG": str(log)}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {json.loads(line)["test"].rpartition("::")[2]: json.loads(line) for line in log.read_text().splitlines()}
    assert lines["test_burns_in_a_child"]["cpu"] >= 0.5 > lines["test_idle"]["cpu"]
    rows = tiers.test_cpu_table(tmp_path, top=1)
    assert rows[0].startswith("The 1 of 2 tests that spent most CPU") and "test_burns_in_a_child" in rows[-1]
