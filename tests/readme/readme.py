"""README.md's command blocks, read as a newcomer reads them (tests/readme/test_readme.py runs them).

A block is a fenced ```bash block. It runs in the environment its first command names (``. .venv/NAME/bin/activate``,
or a ``make`` target whose comment says ``in .venv/NAME``), unless the line before it is ``<!-- not run ... -->``
with the reason. A command is a line, with its ``\\`` continuations; it must exit 0 unless its trailing comment, or
the comment lines right above it, say ``(exit N)``. Its job dir is the last ``--job-dir`` / ``--output-dir`` the
line names (in its comment too: ``make demo-horovod``'s names the one its recipe writes).

The quick starts of the framework pages (``DOCS``) follow the same rules and are read by the same static checks
(an environment per block, a job dir per job, none shared with another page); only the README's blocks are run.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The framework pages whose command blocks a newcomer runs after the README's (checked, not run: tests/readme).
DOCS = tuple(ROOT / "docs" / f"{name}.md" for name in ("pytorch", "tensorflow", "horovod"))
NOT_RUN = "<!-- not run"
ENVIRONMENT = re.compile(r"\.venv/([\w-]+)")
EXIT = re.compile(r"\(exit (\d+)\)")
JOB_DIR = re.compile(r"--(?:job-dir|output-dir)[ =](\S+)")
# The README's first block: the two set-up commands (kept as they are). `make test` is the suite this test belongs to;
# `make demo` runs the PyTorch quick start's 2-replica command into demo-outputs/ (test_make_demo_runs_...).
SETUP = ("make demo", "make test")


@dataclass(frozen=True)
class Command:
    """One command of a block: its text (continuations joined), the exit it must end with, its job dir."""

    text: str
    line: int  # its first line in README.md
    expected_exit: int = 0
    job_dir: str | None = None

    @property
    def shell(self) -> str:
        """The command as the shell runs it (its trailing comment included: bash ignores it)."""
        return self.text

    @property
    def words(self) -> list[str]:
        """The command's words, its comment left out."""
        return shlex.split(self.text.replace("\\\n", " "), comments=True)

    @property
    def trains(self) -> bool:
        """Whether it starts a job that writes a model (``run``, ``local``, a demo)."""
        words = self.words
        if words[:1] == ["make"]:
            return any(w.startswith("demo") for w in words[1:])
        if words[:3] != ["python", "-m", "entrypoint"] or len(words) < 4:
            return False
        return words[3] in ("run", "local")

    @property
    def afresh(self) -> bool:
        """Whether it starts its job dir afresh (``make demo*``: the recipe removes the dir first), so another page
        may run it again into the same dir."""
        words = self.words
        return words[:1] == ["make"] and any(w.startswith("demo") for w in words[1:])

    @property
    def identity(self) -> tuple[str | None, str | None]:
        """The framework and module (or script) the command's run names, where it names them."""
        words = self.words
        framework = words[words.index("--framework") + 1] if "--framework" in words else None
        code = next((words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--module", "--script")), None)
        return framework, code


@dataclass(frozen=True)
class Block:
    """A fenced ```bash block: where it starts, its commands, the environment it runs in, or why it is not run."""

    line: int
    commands: tuple[Command, ...]
    environment: str | None = None
    not_run: str | None = None  # the reason, from its <!-- not run ... --> line
    body: tuple[str, ...] = field(default=(), repr=False)
    page: str = "README.md"  # the file it is in, relative to the checkout


def blocks(text: str | None = None, page: Path = README) -> list[Block]:
    """Every ```bash block of ``page`` (the README unless told; ``text``: its text), in order."""
    lines = (page.read_text() if text is None else text).splitlines()
    name = page.relative_to(ROOT).as_posix()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```bash":
            i += 1
            continue
        start, before = i + 1, (lines[i - 1].strip() if i else "")
        end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
        body = tuple(lines[start:end])
        commands = tuple(parse(body, start + 1))
        first = commands[0].text if commands else ""
        named = ENVIRONMENT.search(first)
        reason = before.removeprefix(NOT_RUN).removesuffix("-->").strip(" :") if before.startswith(NOT_RUN) else None
        found.append(Block(start, commands, named.group(1) if named else None, reason, body, name))
        i = end + 1
    return found


def parse(body: tuple[str, ...], first_line: int) -> list[Command]:
    """The commands of a block's lines (``first_line``: the README line of ``body[0]``)."""
    commands: list[Command] = []
    comments: list[str] = []
    i = 0
    while i < len(body):
        line, number = body[i].rstrip(), first_line + i
        if not line.strip():
            i += 1
            continue
        if line.lstrip().startswith("#"):
            comments.append(line)
            i += 1
            continue
        parts = [line]
        while parts[-1].endswith("\\") and i + 1 < len(body):
            i += 1
            parts.append(body[i].rstrip())
        text = "\n".join(parts)
        said = EXIT.search(" ".join(comments) + " " + (text.split(" #", 1)[1] if " #" in text else ""))
        dirs = JOB_DIR.findall(text)
        commands.append(Command(text, number, int(said.group(1)) if said else 0, dirs[-1] if dirs else None))
        comments = []
        i += 1
    return commands


def runnable(environment: str | None = None, pages: tuple[Path, ...] = (README,)) -> list[Block]:
    """The blocks that run (in ``environment``'s, when given), in the order of ``pages`` (the README's unless told)."""
    return [b for page in pages for b in blocks(page=page)
            if b.not_run is None and (environment is None or b.environment == environment)]
