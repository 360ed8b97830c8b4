"""Write what the families measured: one Markdown table, one PNG plot, the raw JSON, and docs/benchmarks.md.

    python -m bench.report bench/results/<timestamp>.json [--update-docs]   # render a saved run again
"""

from __future__ import annotations

import argparse
import calendar
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.common import REPO, FamilyResult, Row

DOCS = REPO / "docs" / "benchmarks.md"
DOCS_PNG = REPO / "docs" / "benchmarks.png"
HEADER = Path(__file__).with_name("benchmarks_header.md")


def fmt(value: float | None) -> str:
    """A number with about four significant digits, no exponent for everyday sizes."""
    if value is None:
        return "–"
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.4g}" if abs(value) >= 0.001 else f"{value:.2e}"


def _met(row: Row) -> str:
    return "" if row.met is None else ("yes" if row.met else "**no**")


def machine_lines(machine: dict[str, Any], results: Sequence[FamilyResult]) -> list[str]:
    """The machine and the framework versions each venv ran with."""
    gpus = "; ".join(machine.get("gpus") or []) or "none"
    lines = [f"- Machine: {machine['cpu']}, {machine['cores']} cores ({machine['usable_cores']} usable), "
             f"{machine['memory_gib']} GiB RAM, {machine['os']}; GPUs: {gpus}",
             f"- Load average (1, 5, 15 min) before: {machine['load_average']}, after: "
             f"{machine.get('load_average_after', '?')}"]
    seen: dict[str, str] = {}
    for result in results:
        env = result.environment
        for key in ("python", "torch", "tensorflow", "tf_keras", "horovod"):
            if key in env:
                seen.setdefault(key, env[key])
    if seen:
        lines.append("- Versions: " + ", ".join(f"{k} {v}" for k, v in seen.items()))
    return lines


def family_table(result: FamilyResult) -> list[str]:
    """One family's block: its title, a table of its rows, its notes."""
    lines = [f"### {result.title}", ""]
    if result.skipped:
        return [*lines, f"Not run: {result.skipped}", ""]
    lines += ["| group | variant | median | unit | runs | ratio | target | met | note |",
              "|---|---|---:|---|---|---:|---|---|---|"]
    for r in result.rows:
        runs = ", ".join(fmt(v) for v in r.runs)
        ratio = f"{fmt(r.ratio)} {r.ratio_label}".strip() if r.ratio is not None else ""
        lines.append(f"| {r.group} | {r.variant} | {fmt(r.median)} | {r.unit} | {runs} | {ratio} | {r.target} | "
                     f"{_met(r)} | {r.note} |")
    lines.append("")
    where = result.environment.get("executable", "?")
    lines += [f"- {note}" for note in result.notes]
    lines += [f"- ran in `{Path(where).parent.parent.name}` venv, {result.seconds:.0f} s", ""]
    return lines


def targets_table(results: Sequence[FamilyResult]) -> list[str]:
    """Every row that has a target, in one place."""
    lines = ["| family | group | variant | measured | target | met |", "|---|---|---|---:|---|---|"]
    for result in results:
        for r in result.rows:
            if r.target:
                measured = f"{fmt(r.ratio)} {r.ratio_label}" if r.ratio is not None else fmt(r.median)
                lines.append(f"| {result.name} | {r.group} | {r.variant} | {measured} | {r.target} | {_met(r)} |")
    return [*lines, ""]


def markdown(results: Sequence[FamilyResult], machine: dict[str, Any], stamp: str, quick: bool,
             image: str | None) -> str:
    """The whole results page."""
    size = "quick (smoke-test sizes: not for conclusions)" if quick else "full"
    total = sum(r.seconds for r in results)
    lines = [f"## Results of {stamp} ({size}, {total / 60:.1f} min)", "", *machine_lines(machine, results), ""]
    if image:
        lines += [f"![benchmark plot]({image})", ""]
    lines += ["### Targets", "", *targets_table(results)]
    for result in results:
        lines += family_table(result)
    return "\n".join(lines)


def plot(results: Sequence[FamilyResult], machine: dict[str, Any], path: Path, stamp: str) -> None:
    """One horizontal bar chart per family: the medians, coloured by target met / missed / none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in results if r.rows]
    height = 1.2 + sum(0.32 * len(r.rows) + 0.6 for r in shown)
    fig, axes = plt.subplots(len(shown) or 1, 1, figsize=(10, height), squeeze=False,
                             gridspec_kw={"height_ratios": [len(r.rows) for r in shown] or [1]})
    for ax, result in zip(axes[:, 0], shown, strict=False):
        labels = [f"{r.group}: {r.variant}" for r in result.rows]
        colors = ["#999999" if r.met is None else ("#2a9d4b" if r.met else "#d1495b") for r in result.rows]
        ax.barh(range(len(labels)), [r.median for r in result.rows], color=colors)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(result.title, fontsize=8, loc="left")
        ax.set_xlabel(" / ".join(dict.fromkeys(r.unit for r in result.rows)), fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
        for i, r in enumerate(result.rows):
            if r.ratio is not None:
                ax.annotate(f" {fmt(r.ratio)} {r.ratio_label}", (r.median, i), va="center", fontsize=6)
    gpus = "; ".join(machine.get("gpus") or []) or "no GPU"
    fig.suptitle(f"{stamp} - {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, {gpus}\n"
                 "green: target met, red: missed, grey: no target", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / height))  # room for the two-line title
    fig.savefig(path, dpi=72)
    plt.close(fig)


def write(results: Sequence[FamilyResult], machine: dict[str, Any], out: Path, quick: bool, with_plot: bool,
          update_docs: bool, when: float | None = None) -> list[Path]:
    """``<out>/<timestamp>.{json,md,png}``; with ``update_docs`` also docs/benchmarks.md (+ .png)."""
    now = time.time() if when is None else when
    moment = time.gmtime(now)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", moment)
    name = time.strftime("%Y%m%dT%H%M%SZ", moment) + ("-quick" if quick else "")
    out.mkdir(parents=True, exist_ok=True)
    raw = {"stamp": stamp, "time": now, "quick": quick, "machine": machine, "families": [asdict(r) for r in results]}
    paths = [out / f"{name}.json", out / f"{name}.md"]
    paths[0].write_text(json.dumps(raw, indent=2))
    png = out / f"{name}.png" if with_plot else None
    if png is not None:
        plot(results, machine, png, stamp)
        paths.append(png)
    paths[1].write_text(f"# Benchmarks\n\n{markdown(results, machine, stamp, quick, png.name if png else None)}")
    if update_docs:
        if png is not None:
            shutil.copyfile(png, DOCS_PNG)
        body = markdown(results, machine, stamp, quick, DOCS_PNG.name if png is not None else None)
        DOCS.write_text(HEADER.read_text().rstrip() + "\n\n" + body)
        paths.append(DOCS)
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    """Render a saved run (its JSON) again: the table, the plot, and with ``--update-docs`` the docs page."""
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=main.__doc__)
    parser.add_argument("json", type=Path)
    parser.add_argument("--update-docs", action="store_true")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    raw = json.loads(args.json.read_text())
    results = [FamilyResult.from_json(json.dumps(f)) for f in raw["families"]]
    when = raw.get("time") or calendar.timegm(time.strptime(raw["stamp"], "%Y-%m-%d %H:%M UTC"))
    paths = write(results, raw["machine"], args.json.parent, raw["quick"], not args.no_plot, args.update_docs, when)
    print("\n".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
