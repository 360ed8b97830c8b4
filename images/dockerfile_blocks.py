"""Each image's Dockerfile, from what is its own (``images/<name>/Dockerfile.in``) and the stages every image shares
(``images/Dockerfile.blocks``, written once): ``python3 images/catalog.py dockerfiles`` writes them; a test keeps
them current. Standard library only.
"""

from __future__ import annotations

from pathlib import Path

from image_folders import FOLDERS, ROOT, SBOM_PATH, CatalogError, Image

# The one line every Dockerfile's runtime stage has after its last install, before USER (docs/images.md, "Bill of
# materials"; tests/images/test_dockerfiles.py checks each): the package, installed in the layer before, inventories
# the OS packages and the venv's; a change of the package rebuilds it.
SBOM_LINE = f'RUN python -m entrypoint sbom write --variant "${{VARIANT}}" {SBOM_PATH}'
BLOCKS = FOLDERS / "Dockerfile.blocks"  # the stages every image shares, written once: ``#@@ <name>`` starts one
SOURCE = "Dockerfile.in"  # an image's own part of its Dockerfile; ``#@ <block> [argument]`` places a shared block


def blocks(path: Path = BLOCKS) -> dict[str, str]:
    """The shared blocks by name (a block ends at the next ``#@@`` line; its trailing blank lines are dropped)."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in path.read_text().splitlines():
        if line.startswith("#@@ "):
            current = found.setdefault(line[4:].strip(), [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).rstrip("\n") for name, lines in found.items()}


def dockerfile(image: Image, folder: Path | None = None, shared: dict[str, str] | None = None) -> str | None:
    """The Dockerfile ``images/<name>/Dockerfile.in`` makes with the shared blocks (None: the image has no
    Dockerfile.in, its Dockerfile is written by hand). In a block, ``@NAME@`` is the image's name, ``@FRAMEWORK@``
    its framework and ``@ARG@`` the argument its ``#@`` line gives."""
    source = (folder or FOLDERS / image.name) / SOURCE
    if not source.is_file():
        return None
    found = blocks() if shared is None else shared

    def expand(text: str, where: str, depth: int) -> list[str]:
        out: list[str] = []
        for line in text.split("\n"):
            if not line.startswith("#@ "):
                out.append(line)
                continue
            name, _, arg = line[3:].strip().partition(" ")
            if name not in found:
                raise CatalogError(f"{where}: no block {name!r} in {BLOCKS.name} (it has {', '.join(sorted(found))})")
            block = found[name]
            if ("@ARG@" in block) != bool(arg) or depth > 3:
                raise CatalogError(f"{where}: block {name!r} " + ("nests too deep" if depth > 3 else
                                   "takes an argument" if arg == "" else "takes no argument"))
            block = block.replace("@NAME@", image.name).replace("@FRAMEWORK@", image.framework).replace("@ARG@", arg)
            out += expand(block, f"{BLOCKS.name} block {name!r}", depth + 1)
        return out

    return "\n".join(expand(source.read_text(), f"images/{image.name}/{SOURCE}", 0))


def write_dockerfiles(found: tuple[Image, ...]) -> list[str]:
    """Write every generated Dockerfile that is not current; the ones written."""
    written = []
    for image in found:
        text = dockerfile(image)
        target = FOLDERS / image.name / "Dockerfile"
        if text is not None and target.read_text() != text:
            target.write_text(text)
            written.append(str(target.relative_to(ROOT)))
    return written
