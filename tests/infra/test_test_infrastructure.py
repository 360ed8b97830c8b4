"""The test infrastructure of `make test` (docs/testing.md): tests/tiers.py (a tier logged, timed and reported),
tests/diagnostics.py (a failed test says where to look), tests/slots.py (a limit on multi-process tests) and
tests/bytecode.py (a .pyc cut short is removed before a tier runs, the checkout is compiled, pytest's rewritten test
modules written once), tests/uv_flags.py (the venvs' locks installed by uv from pip's sources) and the run order
(tests/durations.json: the longest multi-process tests first)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import bytecode, diagnostics, slots, tiers, uv_flags
from tests.conftest import ROOT, UNKNOWN_SECONDS, run_order, subprocess_env


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


def test_the_checkout_is_compiled_where_imports_may_not_write_bytecode(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for name in ("pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/mod.py"):
        (tmp_path / name).write_text("VALUE = 1\n")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # PYTHONDONTWRITEBYTECODE=1, as this machine's shell has
    bytecode.compile_packages(tmp_path, ("pkg", "absent"))
    compiled = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.pyc"))
    tag = sys.implementation.cache_tag
    assert compiled == [f"pkg/__pycache__/__init__.{tag}.pyc", f"pkg/sub/__pycache__/__init__.{tag}.pyc",
                        f"pkg/sub/__pycache__/mod.{tag}.pyc"]
    assert bytecode.heal([tmp_path], tag) == []  # whole files


def test_pytest_finds_the_rewritten_test_modules_bytecode_wrote_where_imports_may_not_write_bytecode(
        tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "__init__.py").write_text("")
    (tests / "conftest.py").write_text('pytest_plugins = ["tests.plug"]\n')
    (tests / "plug.py").write_text("def pytest_configure(config):\n    assert config is not None\n")
    (tests / "helper.py").write_text("VALUE = 2\n")  # imported plainly: pytest does not rewrite it
    (tests / "test_x.py").write_text("from tests.helper import VALUE\n\ndef test_x():\n    assert VALUE + 1 == 4\n")
    written = bytecode.rewrite_tests(tmp_path)
    tail = f".{sys.implementation.cache_tag}-pytest-{pytest.__version__}.pyc"
    assert sorted(p.name for p in written) == [f"conftest{tail}", f"plug{tail}", f"test_x{tail}"]
    assert bytecode.rewrite_tests(tmp_path) == []  # current: nothing written again
    env = {**subprocess_env(), "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    debug = tmp_path / "debug.log"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
                           f"--debug={debug}", "--rootdir", str(tmp_path), str(tests)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "assert (2 + 1) == 4" in proc.stdout, proc.stdout[-3000:]  # its asserts rewritten
    log = debug.read_text().splitlines()  # traced from the collection on (the conftest and plugins load before)
    assert any(f"found cached rewritten pyc for {tests / 'test_x.py'}" in line for line in log)
    assert not any(line.strip().startswith("rewriting") and str(tests) in line for line in log)
    from _pytest.assertion.rewrite import _read_pyc  # what pytest checks before it uses one: the source's hash

    for name in ("conftest", "plug"):
        assert _read_pyc(tests / f"{name}.py", tests / "__pycache__" / f"{name}{tail}") is not None, name


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


class Item:
    """What the run order reads of a collected test: its node id and its markers."""

    def __init__(self, nodeid: str, *markers: str) -> None:
        self.nodeid, self.markers = nodeid, markers

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name in self.markers else None


def test_the_longest_multi_process_tests_run_first_and_a_new_one_counts_as_typical() -> None:
    items = [Item("unit_a"), Item("short", "slow"), Item("unit_b"), Item("new", "slow"), Item("long", "slow"),
             Item("box", "containers")]
    seconds = {"short": 2.0, "long": 80.0, "box": 30.0, "unit_a": 5.0}
    order = [item.nodeid for item in run_order(items, seconds)]  # type: ignore[arg-type]
    assert order == ["long", "box", "new", "short", "unit_a", "unit_b"]  # new: UNKNOWN_SECONDS, between 30 and 2
    assert 2.0 < UNKNOWN_SECONDS < 30.0


def test_durations_are_recorded_from_the_last_run_longest_first_keeping_tests_that_did_not_run(
        tmp_path: Path) -> None:
    out = tmp_path / "durations.json"
    out.write_text(json.dumps({"tests": {"other_tier::t": 12.0, "a::t": 1.0}}))
    runs = [{"test": "a::t", "wall": 3.04, "cpu": 1.0}, {"test": "b::t", "wall": 40.0, "cpu": 9.0},
            {"test": "unit::t", "wall": 0.01, "cpu": 0.01}]
    (tmp_path / "test-cpu.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    assert tiers.write_durations(tmp_path, out) == 0
    assert list(tiers.read_durations(out).items()) == [("b::t", 40.0), ("other_tier::t", 12.0), ("a::t", 3.0)]
    assert tiers.write_durations(tmp_path / "nothing-ran", out) == 1  # no record: says so, keeps the file
    assert tiers.read_durations(out)["b::t"] == 40.0
    out.write_text("not json")
    assert tiers.read_durations(out) == {} and tiers.read_durations(tmp_path / "absent.json") == {}


def test_the_committed_durations_name_tests_that_exist() -> None:
    """A renamed or merged test leaves its old name behind: the record is rewritten (tests/tiers.py durations)."""
    recorded = tiers.read_durations()
    assert recorded, "tests/durations.json is missing or unreadable"
    sources = {f: (ROOT / f).read_text() for f in {name.split("::")[0] for name in recorded} if (ROOT / f).is_file()}
    gone = [name for name in recorded
            if f"def {name.split('::')[-1].split('[')[0]}(" not in sources.get(name.split("::")[0], "")]
    assert gone == [], "renamed or removed tests: rewrite tests/durations.json (python3 tests/tiers.py durations)"


GUARDS = {  # the two ways a module skips where its venv lacks a package: importing it, or (cheaper) looking it up
    "importorskip": "pytest.importorskip('no_such_module_of_the_tier')\n",
    "skip_unless_installed": "from tests.conftest import skip_unless_installed\n"
                             "skip_unless_installed('no_such_module_of_the_tier')\n",
}


@pytest.mark.parametrize("guard", sorted(GUARDS))
def test_a_tiers_own_module_skipped_at_collection_fails_that_tier_only(tmp_path: Path, guard: str) -> None:
    """A PyTorch module whose import-time dependency is missing: a failure in the catch-all tier that selects it (its
    venv lacks what the tier needs), a skip in the TensorFlow tier (as every other tier's modules skip there), and
    a skip without -m (a developer's run of some files)."""
    (tmp_path / "test_own.py").write_text(
        "import pytest\n"
        f"{GUARDS[guard]}"
        "pytestmark = [pytest.mark.pytorch, pytest.mark.slow]\n"
        "def test_it():\n"
        "    pass\n")
    (tmp_path / "test_other.py").write_text("import pytest\npytestmark = [pytest.mark.pytorch]\n"
                                           "def test_it():\n    pass\n")

    def tier(*marks: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest", str(tmp_path), "-q", "-p", "no:cacheprovider", "-p",
                               "tests.tier_skips", "--rootdir", str(tmp_path), "-W", "ignore", *marks], cwd=tmp_path,
                              env=subprocess_env(), capture_output=True, text=True, timeout=120)

    catch_all = tier("-m", "not horovod and not tensorflow and not jobs and not containers")
    assert catch_all.returncode != 0, catch_all.stdout
    assert "test_own.py: this tier's own test module" in catch_all.stdout and "no_such_module_of_the_tier" in \
        catch_all.stdout
    for other in (tier("-m", "tensorflow"), tier()):
        assert "this tier's own" not in other.stdout and "1 skipped" in other.stdout, other.stdout
    assert tiers_selected("tensorflow", {"tensorflow", "slow"}) and not tiers_selected("tensorflow", {"pytorch"})


def tiers_selected(markexpr: str, markers: set[str]) -> bool:
    from tests.tier_skips import selected

    return selected(markexpr, markers)


def test_uv_installs_from_the_sources_pips_configuration_names_a_variable_over_a_file() -> None:
    listing = "\n".join([":env:.find-links='/opt/wheels /more/wheels'", "global.find-links='/elsewhere'",
                          "global.extra-index-url='file:///a/simple file:///b/simple'", "global.cert='/etc/ca.crt'",
                          "install.constraint='/etc/c.txt'", "global.constraint='/etc/other.txt'",
                          ":env:.default-timeout='180'"])
    assert uv_flags.flags(listing) == [
        "--index-strategy", "unsafe-best-match",  # every index weighed alike, as pip does
        "--extra-index-url", "file:///a/simple", "--extra-index-url", "file:///b/simple",
        "--find-links", "/opt/wheels", "--find-links", "/more/wheels", "--constraint", "/etc/c.txt"]
    assert uv_flags.flags("") == ["--index-strategy", "unsafe-best-match"]  # pip's defaults are uv's


def test_the_makefile_installs_each_image_venvs_lock_with_the_pinned_uv_and_byte_compiles_it(tmp_path: Path) -> None:
    proc = subprocess.run(["make", "--no-print-directory", "-n", f"VENV_DIR={tmp_path}", f"{tmp_path}/pytorch/.ready"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert f"{tmp_path}/.uv/bin/pip --disable-pip-version-check install -q uv==" in proc.stdout
    uv = f"{tmp_path}/.uv/bin/uv pip install -q --python {tmp_path}/pytorch/bin/python --compile-bytecode "
    locks = "-r images/pytorch/requirements-cpu.txt -r tests/requirements.txt"
    assert f"{uv}$(python3 tests/uv_flags.py) {locks}" in proc.stdout
