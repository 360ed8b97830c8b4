"""The size of each locally built image, its largest layers, and its budget (images/size-budget.json)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from build_common import ROOT, Failure, image_ref
from container_engine import Engine

BUDGET_FILE = ROOT / "images" / "size-budget.json"


def image_size(engine: Engine, ref: str) -> int:
    return int(engine.output("image", "inspect", "--format", "{{.Size}}", ref).strip())


def largest_layers(engine: Engine, ref: str, count: int = 5) -> list[tuple[int, str]]:
    """The ``count`` largest layers: (bytes, the instruction that made it)."""
    if engine.name == "podman":  # podman 4 prints sizes for humans in templates, bytes in JSON
        rows = [(int(layer["size"]), str(layer["CreatedBy"]))
                for layer in json.loads(engine.output("history", "--no-trunc", "--format", "json", ref))]
    else:
        out = engine.output("history", "--no-trunc", "--human=false", "--format", "{{.Size}}\t{{.CreatedBy}}", ref)
        rows = [(int(size), created_by) for size, _, created_by in (line.partition("\t") for line in out.splitlines())
                if size.isdigit()]
    return sorted(((size, " ".join(created_by.split())) for size, created_by in rows), reverse=True)[:count]


def load_budget() -> tuple[float, dict[str, int]]:
    data = json.loads(BUDGET_FILE.read_text())
    return float(data["margin"]), {name: int(size) for name, size in data["bytes"].items()}


def budget_problem(image: str, size: int) -> str | None:
    """Why ``size`` breaks the image's budget, or None."""
    margin, budget = load_budget()
    if image not in budget:
        return f"{image} has no entry in {BUDGET_FILE.relative_to(ROOT)}"
    limit = budget[image] * (1 + margin)
    if size > limit:
        return (f"{image_ref(image)} is {_gb(size)}, over its budget {_gb(budget[image])} + {margin:.0%} "
                f"({BUDGET_FILE.relative_to(ROOT)}): find what grew in its largest layers, cut it, or raise the "
                f"budget in the same change")
    return None


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


def size_report(engine: Engine, images: Sequence[str]) -> list[str]:
    """Print each image's size and largest layers; return the budget problems."""
    problems = []
    for image in images:
        if not engine.exists(image_ref(image)):
            raise Failure(f"{image_ref(image)} is not built: run `make image-test` (or local_build.py build {image})")
        size = image_size(engine, image_ref(image))
        print(f"{image_ref(image)}: {_gb(size)} ({size} bytes)")
        for layer_size, created_by in largest_layers(engine, image_ref(image)):
            print(f"  {_gb(layer_size):>9}  {created_by[:110]}")
        problem = budget_problem(image, size)
        if problem:
            problems.append(problem)
    return problems
