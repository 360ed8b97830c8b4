"""The size of each locally built image, its largest layers, and its budget (images/<name>/image.toml)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import catalog
from build_common import ROOT, Failure, image_ref
from container_engine import Engine


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


def load_budget(variant: str = "cpu") -> tuple[float, dict[str, int]]:
    """The margin and each image's budget for ``variant`` (bytes), from the images' folders."""
    return catalog.SIZE_MARGIN, {image.name: image.size_budget[variant] for image in catalog.images()}


def budget_problem(image: str, size: int, variant: str = "cpu") -> str | None:
    """Why ``size`` breaks the budget of the image's variant, or None."""
    margin, budget = load_budget(variant)
    spec = (ROOT / "images" / image / catalog.SPEC).relative_to(ROOT)
    if image not in budget:
        return f"{image} has no image folder with a {catalog.SPEC} (images/{image}/)"
    limit = budget[image] * (1 + margin)
    if size > limit:
        return (f"{image_ref(image, variant)} is {_gb(size)}, over its budget {_gb(budget[image])} + {margin:.0%} "
                f"({spec} [size_budget] {variant}): find what grew in its largest layers, cut it, or raise the "
                f"budget in the same change")
    return None


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


def size_report(engine: Engine, images: Sequence[str], variant: str = "cpu") -> list[str]:
    """Print each image's size and largest layers; return the budget problems."""
    problems = []
    for image in images:
        ref = image_ref(image, variant)
        if not engine.exists(ref):
            target, gpu = ("image-test", "") if variant == "cpu" else ("image-test-gpu", " --gpu")
            raise Failure(f"{ref} is not built: run `make {target}` (or local_build.py build{gpu} {image})")
        size = image_size(engine, ref)
        print(f"{ref}: {_gb(size)} ({size} bytes)")
        for layer_size, created_by in largest_layers(engine, ref):
            print(f"  {_gb(layer_size):>9}  {created_by[:110]}")
        problem = budget_problem(image, size, variant)
        if problem:
            problems.append(problem)
    return problems
