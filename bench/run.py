"""``python -m bench``: every benchmark family side by side in one run, one table and one plot.

    python -m bench                      # the full suite (what `make bench` runs, with --update-docs)
    python -m bench --quick              # a smoke-test size of every family
    python -m bench --only gpt           # one family (e.g. on a GPU machine)

Each family runs in its own process, in the venv that has its framework (`.venv/horovod` for Horovod,
`.venv/tensorflow` for TensorFlow, this interpreter otherwise), and hands back JSON; this process then
writes ``bench/results/<timestamp>.{md,png,json}`` and, with ``--update-docs``, docs/benchmarks.md.
``python -m bench.run --family NAME --result FILE`` is what runs one family in its process.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import PYTORCH_PYTHON, REPO, FamilyResult, clean_env

# family -> (module, venvs it can run in, best first); "pytorch" is this interpreter unless --python says otherwise.
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "launch": ("bench.launch", ("pytorch",)),
    "loop": ("bench.loop", ("pytorch",)),
    "checkpoint": ("bench.checkpoint", ("pytorch",)),
    "collectives": ("bench.collectives", ("horovod", "pytorch")),
    "tensorflow": ("bench.tf_mwms", ("tensorflow",)),
    "memory": ("bench.memory", ("horovod", "pytorch")),
    "gpt": ("bench.gpu", ("pytorch",)),
    "recovery": ("bench.recovery", ("pytorch",)),
    "chaos": ("bench.chaos", ("pytorch",)),
    "restart": ("bench.compile_restart", ("pytorch",)),
    "stops": ("bench.stops", ("pytorch",)),
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The orchestrator's options (and ``--family`` for one family's own process)."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke-test sizes (seconds per family)")
    parser.add_argument("--only", help=f"comma-separated families (default all: {','.join(FAMILIES)})")
    parser.add_argument("--out", default=str(REPO / "bench" / "results"), help="where results are written")
    parser.add_argument("--update-docs", action="store_true", help="rewrite docs/benchmarks.md with these results")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (when matplotlib is not installed)")
    parser.add_argument("--python", action="append", default=[], metavar="VENV=PATH",
                        help="interpreter for a venv (pytorch, horovod, tensorflow); PATH 'none' disables it")
    parser.add_argument("--family", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.families = args.only.split(",") if args.only else list(FAMILIES)
    unknown = sorted(set(args.families) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown family {', '.join(unknown)}; choose from {', '.join(FAMILIES)}")
    return args


def interpreters(overrides: Sequence[str]) -> dict[str, str | None]:
    """The python of each venv: this one for pytorch, ``.venv/<name>`` for the others, unless overridden."""
    found: dict[str, str | None] = {"pytorch": sys.executable}
    for name in ("horovod", "tensorflow"):
        path = REPO / ".venv" / name / "bin" / "python"
        found[name] = str(path) if path.exists() else None
    for item in overrides:
        name, _, given = item.partition("=")
        found[name] = None if given in ("", "none") else given
    return found


def run_family(name: str, quick: bool, pythons: dict[str, str | None]) -> FamilyResult:
    """One family in its own process, in the first of its venvs that exists."""
    venvs = FAMILIES[name][1]
    venv = next((v for v in venvs if pythons.get(v)), None)
    if venv is None:
        return FamilyResult(name, name, skipped=f"needs .venv/{venvs[0]} (make venv-{venvs[0]})")
    print(f"[bench] {name}: running with {pythons[venv]}", flush=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [str(pythons[venv]), "-m", "bench.run", "--family", name, "--result", str(out)]
        torch_python = {PYTORCH_PYTHON: str(pythons["pytorch"])} if pythons.get("pytorch") else {}
        proc = subprocess.run([*cmd, *(["--quick"] if quick else [])], env=clean_env(torch_python), cwd=REPO,
                              check=False)
        if proc.returncode != 0 or not out.exists():
            return FamilyResult(name, name, skipped=f"FAILED: exit code {proc.returncode} (output above)")
        result = FamilyResult.from_json(out.read_text())
    result.seconds = round(time.perf_counter() - started, 1)
    print(f"[bench] {name}: done in {result.seconds:.0f} s", flush=True)
    return result


def family_main(args: argparse.Namespace) -> int:
    """In a family's own process: run it, write its JSON."""
    from bench.common import versions

    module = importlib.import_module(FAMILIES[args.family][0])
    result: FamilyResult = module.run(args.quick)
    result.environment = {**versions(), **result.environment}
    Path(args.result).write_text(result.to_json())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected families one after another, then write the table, the plot and the docs."""
    args = parse_args(argv)
    if args.family:
        return family_main(args)
    from bench import report
    from bench.machine import describe

    pythons = interpreters(args.python)
    machine = describe()
    results = [run_family(name, args.quick, pythons) for name in args.families]
    machine["load_average_after"] = describe()["load_average"]
    paths = report.write(results, machine, Path(args.out), quick=args.quick, with_plot=not args.no_plot,
                         update_docs=args.update_docs)
    print(f"[bench] results: {', '.join(str(p) for p in paths)}", flush=True)
    failed = [r.name for r in results if r.skipped.startswith("FAILED")]
    if failed:
        print(f"[bench] failed families: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
