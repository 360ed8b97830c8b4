"""Run the tiers of `make test` side by side and measure them (standard library only: runs before any venv).

    python3 tests/tiers.py run NAME [--log-dir D] [--stream] -- COMMAND ...   # one tier, logged and timed
    python3 tests/tiers.py measure [--label L] [--hog N] [--log-dir D] -- make test   # a whole run: wall, CPU, table
    python3 tests/tiers.py table [--log-dir D] [--since EPOCH] [--cpu N]       # the tiers table of the last run
    python3 tests/tiers.py durations [--log-dir D]     # tests/durations.json from the last run: longest tests first

``run`` writes the tier's whole output to ``D/NAME.log`` (and, with --stream, to the terminal as well), prints one
line when it starts, a progress line every few minutes, and one when it ends (wall time and the CPU time of
everything it started); a failed tier then prints the part of its log that says what failed (pytest's failures
with their replica logs and failure records, tests/conftest.py adds them) so a red CI run reads without a
rerun. Each finished tier appends a JSON line to ``D/tiers.jsonl``.

``measure`` runs a command (default: make test) and reports its wall time, the CPU time of its whole process tree,
the machine's average CPU use from /proc/stat (all processes: other work on the machine counts too, and is shown
as the load average at the start), and the table of the tiers that ran inside it: when each started and ended,
so what ran beside what. The report goes to stdout and to ``D/timing.md``, and is appended to ``D/timings.md``
(docs/testing.md explains it). ``--hog N`` keeps N busy loops running beside the command (N cores taken by other
work: the "green under load" check); their CPU time is not counted as the run's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOG_DIR = ROOT / "test-logs"
PROGRESS_EVERY = 300.0  # seconds between a running tier's progress lines
FAILURE_HEADER = re.compile(r"^=+ (FAILURES|ERRORS) =+$")
SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+$")
RESULT_LINE = re.compile(r"^=+ .*\b(passed|failed|error|errors|skipped|deselected|no tests ran)\b.* in [0-9.]+s")
TAIL_LINES = 150  # a failed tier without pytest output (a build, lint): its last lines


def minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60}m{whole % 60:02d}s"


def say(message: str) -> None:
    """One whole line (tiers running side by side under make -j never split each other's lines)."""
    sys.stdout.write(f"[tiers] {message}\n")
    sys.stdout.flush()


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# ---- run: one tier --------------------------------------------------------------------------------------

def _copy(stream: TextIO, log: TextIO, echo: bool, last: list[str]) -> None:
    for line in stream:
        log.write(line)
        log.flush()
        if echo:
            sys.stdout.write(line)
            sys.stdout.flush()
        if line.strip():
            last[0] = line.rstrip("\n")


def failure_excerpt(lines: Sequence[str]) -> list[str]:
    """What a failed tier's log says about the failure: pytest's failures and summary, else the last lines."""
    for i, line in enumerate(lines):
        if FAILURE_HEADER.match(line):
            return list(lines[i:])
    for i, line in enumerate(lines):
        if SUMMARY_HEADER.match(line):
            return list(lines[i:])
    return list(lines[-TAIL_LINES:])


def pytest_result(lines: Sequence[str]) -> str | None:
    """pytest's last line ("== 885 passed, 2 skipped in 912.3s =="), without the rulers."""
    for line in reversed(lines):
        if RESULT_LINE.match(line.strip()):
            return line.strip().strip("=").strip()
    return None


def run_tier(name: str, command: Sequence[str], log_dir: Path, stream: bool) -> int:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    shown = log_path.relative_to(ROOT) if log_path.is_relative_to(ROOT) else log_path
    say(f"{name}: started: {' '.join(command)} (log {shown})")
    started, cpu_before, last = time.time(), children_cpu(), [""]
    with log_path.open("w", encoding="utf-8", errors="replace") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", cwd=ROOT)
        assert proc.stdout is not None
        copier = threading.Thread(target=_copy, args=(proc.stdout, log, stream, last), daemon=True)
        copier.start()
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

        def forward(signum: int, frame: object) -> None:  # make's Ctrl-C / CI's cancel reach the tier
            proc.send_signal(signum)

        for s in previous:
            signal.signal(s, forward)
        try:
            while True:
                try:
                    code = proc.wait(timeout=PROGRESS_EVERY)
                    break
                except subprocess.TimeoutExpired:
                    say(f"{name}: running for {minutes(time.time() - started)}: {last[0][-100:]}")
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        copier.join(timeout=30)
    wall, cpu = time.time() - started, children_cpu() - cpu_before
    lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    result = pytest_result(lines)
    record = {"tier": name, "start": started, "end": started + wall, "wall": round(wall, 1), "cpu": round(cpu, 1),
              "exit": code, "result": result}
    with (log_dir / "tiers.jsonl").open("a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
    outcome = "passed" if code == 0 else f"FAILED (exit {code})"
    say(f"{name}: {outcome} in {minutes(wall)}, CPU {minutes(cpu)} ({cpu / max(wall, 1e-9):.0%} of a core)"
        + (f": {result}" if result else ""))
    if code != 0 and not stream:
        excerpt = failure_excerpt(lines)
        say(f"{name}: what failed ({len(excerpt)} of {len(lines)} lines of {log_path}):")
        sys.stdout.write("".join(f"[{name}] {line}\n" for line in excerpt))
        say(f"{name}: end of the failure report; the whole log is {log_path}")
        sys.stdout.flush()
    return code


# ---- measure: a whole run -------------------------------------------------------------------------------

def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of every core since boot (/proc/stat's first line)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user
    return total - idle, total


def tier_records(log_dir: Path, since: float = 0.0) -> list[dict[str, Any]]:
    path = log_dir / "tiers.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted((r for r in records if r["start"] >= since), key=lambda r: r["start"])


def tier_table(records: Sequence[dict[str, Any]], origin: float | None = None) -> list[str]:
    """Markdown: each tier's start and end (minutes into the run), wall and CPU time, and what overlapped it."""
    if not records:
        return ["(no tier ran)"]
    origin = min(r["start"] for r in records) if origin is None else origin
    rows = ["| tier | from | to | wall | CPU | beside it | result |", "|---|---|---|---|---|---|---|"]
    for r in records:
        beside = [o["tier"] for o in records if o is not r and o["start"] < r["end"] and o["end"] > r["start"]]
        result = "passed" if r["exit"] == 0 else f"**failed ({r['exit']})**"
        if r.get("result"):
            result += f": {r['result']}"
        rows.append(f"| {r['tier']} | {minutes(r['start'] - origin)} | {minutes(r['end'] - origin)} | "
                    f"{minutes(r['wall'])} | {minutes(r['cpu'])} | {', '.join(beside) or '-'} | {result} |")
    return rows


def test_cpu_table(log_dir: Path, top: int) -> list[str]:
    """The ``top`` tests that spent most CPU (theirs and their processes', tests/cputime.py), and the share of all."""
    path = log_dir / "test-cpu.jsonl"
    if top <= 0 or not path.exists():
        return []
    tests = sorted((json.loads(line) for line in path.read_text().splitlines() if line.strip()),
                   key=lambda t: -t["cpu"])
    total = sum(t["cpu"] for t in tests) or 1e-9
    shown = tests[:top]
    rows = [f"The {len(shown)} of {len(tests)} tests that spent most CPU (with their processes): "
            f"{minutes(sum(t['cpu'] for t in shown))} of {minutes(total)} ({sum(t['cpu'] for t in shown) / total:.0%})",
            "", "| CPU | wall | test |", "|---|---|---|"]
    rows += [f"| {t['cpu']:.1f} s | {t['wall']:.1f} s | {t['test']} |" for t in shown]
    return rows


DURATIONS = ROOT / "tests" / "durations.json"
DURATION_FLOOR = 0.05  # seconds: shorter tests (the unit tests, skipped ones) are left out of the record


def read_durations(path: Path = DURATIONS) -> dict[str, float]:
    """The wall seconds of each test on record in ``path`` (none if it is absent or unreadable)."""
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text())["tests"].items()}
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return {}


def write_durations(log_dir: Path, out: Path = DURATIONS) -> int:
    """Record each test's wall time from the last run's test-cpu.jsonl in ``out`` (tests/conftest.py starts the
    longest multi-process tests first by it); keeps what the log does not cover (a tier that did not run)."""
    path = log_dir / "test-cpu.jsonl"
    if not path.exists():
        say(f"durations: no {path} (run make test first)")
        return 1
    kept = read_durations(out)
    ran = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    kept.update({t["test"]: round(float(t["wall"]), 1) for t in ran})
    tests = {name: wall for name, wall in sorted(kept.items(), key=lambda kv: (-kv[1], kv[0]))
             if wall >= DURATION_FLOOR}
    out.write_text(json.dumps({"about": "wall seconds of each test in a recorded make test run (tests/tiers.py "
                                        "durations); tests/conftest.py starts the longest multi-process tests first",
                               "tests": tests}, indent=0) + "\n")
    say(f"durations: {len(tests)} tests of {len(ran)} recorded in {out}")
    return 0


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a live process has used (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(command: Sequence[str], label: str, log_dir: Path, hogs: int = 0) -> int:
    log_dir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    cores = os.cpu_count() or 1
    hog_procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
    beside = f", {hogs} busy loop(s) beside it" if hogs else ""
    started, (busy0, total0), cpu0 = time.time(), cpu_jiffies(), children_cpu()
    say(f"measure: {' '.join(command)} ({label}; {cores} cores, load average {load[0]:.2f} at the start{beside})")
    try:
        code = subprocess.run(command, cwd=ROOT, check=False).returncode
    finally:
        hog_cpu = sum(process_cpu(p.pid) for p in hog_procs)
        for p in hog_procs:
            p.kill()
            p.wait()
    wall, (busy1, total1), cpu = time.time() - started, cpu_jiffies(), children_cpu() - cpu0 - hog_cpu
    machine = (busy1 - busy0) / max(total1 - total0, 1) * cores
    lines = [
        f"### {label}: `{' '.join(command)}` {'passed' if code == 0 else f'FAILED (exit {code})'}",
        "",
        f"- {time.strftime('%Y-%m-%d %H:%M', time.localtime(started))}, {cores} cores, "
        f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the start{beside}",
        f"- wall time **{minutes(wall)}** ({wall:.0f} s)",
        f"- CPU time of the run's own processes {minutes(cpu)}: **{cpu / max(wall, 1e-9):.0%}** on average "
        f"(of {cores * 100}%)",
        f"- the machine's average CPU use (/proc/stat, every process{', the busy loops included' if hogs else ''}): "
        f"{machine:.0%}",
        "",
        *tier_table(tier_records(log_dir, since=started), origin=started),
    ]
    report = "\n".join(lines) + "\n"
    (log_dir / "timing.md").write_text(report)
    with (log_dir / "timings.md").open("a") as every:
        every.write(report + "\n")
    sys.stdout.write("\n" + report)
    say(f"measure: report written to {log_dir / 'timing.md'}")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_cmd = sub.add_parser("run", help="run one tier, logged and timed")
    run_cmd.add_argument("name")
    run_cmd.add_argument("--stream", action="store_true", help="also copy the output to the terminal")
    measure_cmd = sub.add_parser("measure", help="run a command (default make test) and report its time and CPU use")
    measure_cmd.add_argument("--label", default="run", help="what kind of run (cold, warm, under load, ...)")
    measure_cmd.add_argument("--hog", type=int, default=0, metavar="N", help="N busy loops beside the command")
    table_cmd = sub.add_parser("table", help="the tiers table of the recorded runs")
    table_cmd.add_argument("--since", type=float, default=0.0, help="only tiers started after this epoch time")
    table_cmd.add_argument("--cpu", type=int, default=0, metavar="N",
                           help="then the N tests that spent most CPU (test-cpu.jsonl, tests/cputime.py)")
    durations_cmd = sub.add_parser("durations", help="record the last run's test durations in tests/durations.json")
    for cmd in (run_cmd, measure_cmd, table_cmd, durations_cmd):
        cmd.add_argument("--log-dir", type=Path, default=Path(os.environ.get("TIER_LOG_DIR", DEFAULT_LOG_DIR)))
    args, rest = parser.parse_known_args(argv)
    rest = rest[1:] if rest[:1] == ["--"] else rest
    log_dir = args.log_dir if args.log_dir.is_absolute() else ROOT / args.log_dir
    if args.command == "run":
        if not rest:
            parser.error("run NAME -- COMMAND: no command")
        return run_tier(args.name, rest, log_dir, args.stream)
    if args.command == "measure":
        return measure(rest or ["make", "test"], args.label, log_dir, args.hog)
    if rest:
        parser.error(f"unexpected arguments {rest}")
    if args.command == "durations":
        return write_durations(log_dir)
    print("\n".join(tier_table(tier_records(log_dir, args.since))))
    if rows := test_cpu_table(log_dir, args.cpu):
        print("\n" + "\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
