"""The README, run as a newcomer runs it (issue 57): its command blocks, top to bottom, in a fresh directory.

``test_the_readme_runs_top_to_bottom[NAME]`` runs, in README order, every block that names ``.venv/NAME`` as its
environment (tests/readme/readme.py reads them), as one shell session, exactly as written, in a fresh directory: a
link per top-level entry this checkout tracks and ``.venv/`` linking the image environments beside the one running
this test, which is what a fresh clone has once ``make venv-NAME`` ran (the blocks' own first command, run here too:
make finds the environment current). Each command must exit as the README says (0, or its comment's ``(exit N)``,
whose output must end with one ``entrypoint: error:`` line), and each job it starts must leave its model where the
README says, ``<job dir>/model``, and a hooks module's job a committed checkpoint in ``<job dir>/checkpoints`` (some
also what they are known to reach: ``RESULTS``). Each environment's blocks
run in that image's test tier (its marker, ``slow``): PyTorch's in the catch-all tier, TensorFlow's and Horovod's in
theirs. No two environments' blocks share a job dir (``test_every_job_has_a_job_dir_of_its_own``), so running each
environment's blocks in a directory of its own is running the README top to bottom.

The environment the commands get is the suite's (``tests.conftest.subprocess_env``: one CPU a job, no cluster
variables, no metadata server), without make's own variables (``MAKEFLAGS``: make test's jobserver is not the
README's). Nothing shortens the commands: the README shows them as they run.

Not run: the README's first block (the two set-up commands: ``make test`` is the suite this test belongs to, and
``make demo`` runs the PyTorch quick start's 2-replica command into ``demo-outputs/``, which
``test_make_demo_runs_the_quick_starts_two_replica_command`` checks), and each block marked ``<!-- not run ... -->``
with its reason (a GPU machine with Docker and gcloud).

The static checks (environment named, a job dir per job) also read the framework pages' quick starts
(``readme.DOCS``), which are not run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from entrypoint.outputs.checkpoints import committed
from entrypoint.planning.usercode import is_hooks_module
from tests.conftest import ROOT, subprocess_env
from tests.readme.readme import DOCS, README, SETUP, Command, blocks, runnable
from tests.runs import summary

MAKE_VARIABLES = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MAKE_TERMOUT", "MAKE_TERMERR")
# Generated or ignored at the top of a checkout, never in a fresh clone (used when git cannot list what is tracked).
UNTRACKED = {".git", ".venv", ".build", "test-logs", "outputs", "demo-outputs", "demo-outputs-horovod", "spec.json",
             ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis", "build", "dist"}
BLOCK_TIMEOUT = 1800  # seconds for one environment's blocks: a hang, not a slow machine, fails it


def _images() -> list[tuple[str, str]]:
    """Every image's name and test marker (images/<name>/image.toml, as tests/conftest.py registers them)."""
    catalog = sys.modules["images_catalog"]  # loaded by tests/conftest.py's pytest_configure
    return [(image.name, image.marker) for image in catalog.images()]


def _tracked_top_level() -> list[str]:
    """The top-level entries of this checkout that a clone has."""
    try:
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
        names = {path.split("/", 1)[0] for path in listed.decode().split("\0") if path}
    except (OSError, subprocess.CalledProcessError):
        names = {entry.name for entry in ROOT.iterdir()} - UNTRACKED
    return sorted(name for name in names if (ROOT / name).exists())


def fresh_clone(where: Path) -> Path:
    """A directory that has what a fresh clone of this checkout has, and the image environments in ``.venv/``."""
    clone = where / "clone"
    clone.mkdir()
    for name in _tracked_top_level():
        (clone / name).symlink_to(ROOT / name)
    venvs = clone / ".venv"  # a directory of links: make's `rm -rf .venv/NAME` would only remove a link
    venvs.mkdir()
    for venv in Path(sys.prefix).parent.iterdir():
        if (venv / "bin" / "python").exists():
            (venvs / venv.name).symlink_to(venv)
    return clone


def script(commands: list[Command], exits: Path) -> str:
    """One shell session: each command as written, a marker line before it, its exit status recorded after it."""
    lines = ["cd \"$README_CLONE\""]
    for number, command in enumerate(commands):
        lines += [f"echo {shlex.quote(f'### README command {number} (README.md line {command.line})')}",
                  command.shell, f"echo $? >> {shlex.quote(str(exits))}"]
    return "\n".join(lines) + "\n"


def _segment(output: str, number: int) -> str:
    """The output of command ``number``."""
    parts = re.split(r"^### README command (\d+) .*$", output, flags=re.MULTILINE)
    found = {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}
    return found.get(number, "")


def _model_written(job_dir: Path) -> bool:
    model = job_dir / "model"
    return model.is_dir() and any(p.is_file() for p in model.rglob("*"))


def _hooks_job(command: Command) -> bool:
    """Whether the command's job runs a hooks module (our loop, which commits checkpoints in ``<job dir>/checkpoints``,
    as the README says); a script, a plain module, ``make demo-horovod`` or ``local --spec`` need not."""
    words = command.words
    return "--module" in words[:-1] and is_hooks_module(words[words.index("--module") + 1])


# What some of the README's jobs are known to reach, beyond a model where the README says: job dir -> a check of the
# clone's job dir and the command's output. The TensorFlow ones were tests of their own in
# tests/tensorflow/test_examples.py that ran the same commands; the README now runs them.
STATED_VAL_ACCURACY = 0.95  # trainers/tabular_keras.py's docstring


def _tabular_reaches_its_stated_accuracy(job: Path, output: str) -> None:
    history = summary(job / "model")["history"]
    assert len(history["val_accuracy"]) == 20 and history["val_accuracy"][-1] >= STATED_VAL_ACCURACY, history
    assert "is slow compared to the batch time" not in output  # tf-keras' timing of our own callbacks (issue 57)


def _horovod_lines_carry_the_rank_once(job: Path, output: str) -> None:
    """The Horovod launcher prefixes each worker's lines with its rank (``[rank-0]``): the worker adds none."""
    assert "[rank-0] " in output and not re.search(r"\[rank-\d+\] .*\[rank \d+/\d+\]", output), output[-3000:]


def _keras_3_on_one_node(job: Path, output: str) -> None:
    assert "keras 3." in output and (job / "model" / "model.keras").is_file()
    assert float(output.split("val_accuracy")[-1].split()[0]) >= 0.9


def _tf_keras_on_two_replicas(job: Path, output: str) -> None:
    assert output.count("tf_keras 2.") == 2 and (job / "model" / "model.keras").is_file()
    assert [p for p in job.parent.rglob("*") if p.name.startswith(("workertemp_", "tf-nonchief-save-"))] == []


RESULTS: dict[str, Callable[[Path, str], None]] = {
    "outputs/tabular": _tabular_reaches_its_stated_accuracy,
    "outputs/digits-keras": _keras_3_on_one_node,
    "outputs/digits-tf-keras": _tf_keras_on_two_replicas,
    "demo-outputs-horovod": _horovod_lines_carry_the_rank_once,
}


def _params() -> list[pytest.param]:  # type: ignore[valid-type]
    return [pytest.param(name, id=name, marks=[pytest.mark.slow, getattr(pytest.mark, marker)])
            for name, marker in _images()]


@pytest.mark.timeout(BLOCK_TIMEOUT + 120)
@pytest.mark.parametrize("environment", _params())
def test_the_readme_runs_top_to_bottom(environment: str, tmp_path: Path) -> None:
    ours = runnable(environment)
    if not ours:
        pytest.skip(f"no README block runs in .venv/{environment}")
    if Path(sys.prefix).name != environment:
        pytest.skip(f"the README's .venv/{environment} blocks run in that image's tier, not in {sys.prefix}")
    clone, exits = fresh_clone(tmp_path), tmp_path / "exits"
    commands = [c for block in ours for c in block.commands]
    env = {k: v for k, v in subprocess_env({"README_CLONE": str(clone)}).items() if k not in MAKE_VARIABLES}
    stale = subprocess.run(["make", "-q", f".venv/{environment}/.ready"], cwd=clone, env=env, capture_output=True)
    assert stale.returncode == 0, (f".venv/{environment} is older than what makes it (its lock, pyproject.toml): the "
                                   f"README's `make venv-{environment}` would rebuild it; run make venv-{environment}")
    proc = subprocess.run(["bash", "-c", script(commands, exits)], cwd=clone, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=BLOCK_TIMEOUT)  # as a terminal shows them
    got = [int(line) for line in exits.read_text().split()] if exits.exists() else []
    for number, command in enumerate(commands):
        segment = _segment(proc.stdout, number)
        said = f"README.md line {command.line}: {command.text}\n--- its output (end) ---\n{segment[-4000:]}"
        assert number < len(got), f"the session ended before this command\n{said}\n{proc.stdout[-3000:]}"
        assert got[number] == command.expected_exit, f"exit {got[number]}, the README says {command.expected_exit}\n" \
                                                     f"{said}"
        if command.expected_exit:  # a refusal the README shows: one line, the last
            errors = [line for line in segment.splitlines() if line.startswith("entrypoint: error:")]
            assert len(errors) == 1 and segment.strip().splitlines()[-1] == errors[0], f"not one error line\n{said}"
        elif command.trains and command.job_dir is not None:
            assert _model_written(clone / command.job_dir), f"no model in {command.job_dir}/model\n{said}"
            if _hooks_job(command):
                assert committed(clone / command.job_dir / "checkpoints", warn=False), \
                    f"no committed checkpoint in {command.job_dir}/checkpoints\n{said}"
            if command.job_dir in RESULTS:
                RESULTS[command.job_dir](clone / command.job_dir, segment)


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda page: page.name)
def test_every_command_block_names_its_environment_or_why_it_is_not_run(page: Path) -> None:
    """Each ```bash block of the README and of the framework pages' quick starts starts by naming the environment it
    runs in (an image's .venv), or is marked not run with a reason: a newcomer knows which Python each command
    needs."""
    images = {name for name, _ in _images()}
    found = blocks(page=page)
    assert found, f"no ```bash block in {page.name}"
    for block in found:
        where = f"{block.page} line {block.line}"
        if block.not_run is not None:
            assert len(block.not_run) > 20, f"{where}: a block not run says why"
            continue
        assert block.environment in images, f"{where}: the first command names no image's .venv/NAME: " \
                                            f"{block.commands[0].text if block.commands else '(empty)'}"
        if any(c.words[:1] == ["python"] for c in block.commands):  # `python` is the environment's: activated first
            assert f".venv/{block.environment}/bin/activate" in block.commands[0].words, \
                f"{where}: its python commands need `. .venv/{block.environment}/bin/activate` first"


def test_every_job_has_a_job_dir_of_its_own() -> None:
    """Every command that starts a job names its job dir; one job dir holds one job (framework and code), bar the
    commands the README shows being refused there; no two environments' blocks share a job dir (each environment's
    blocks run in a directory of their own, as if one after another in one clone). The framework pages' quick starts
    (not run) too, and none of their job dirs is another page's: run after the README, each starts its own job, not
    refused and not resuming the README's (a ``make demo*`` recipe starts its dir afresh, so it may be shown twice)."""
    owner: dict[str, tuple[str, str, tuple[str | None, str | None]]] = {}
    for block in runnable(pages=(README, *DOCS)):
        for command in block.commands:
            if not command.trains:
                continue
            where = f"{block.page} line {command.line}"
            assert command.job_dir, f"{where}: a job without --job-dir / --output-dir writes into ./outputs"
            assert block.environment is not None
            first = owner.setdefault(command.job_dir, (block.environment, block.page, command.identity))
            assert first[0] == block.environment, f"{where}: {command.job_dir} is also a .venv/{first[0]} job's"
            assert first[1] == block.page or command.afresh, f"{where}: {command.job_dir} is also {first[1]}'s job dir"
            if command.expected_exit == 0:
                assert first[2] == command.identity, f"{where}: {command.job_dir} holds another job"


def test_make_demo_runs_the_quick_starts_two_replica_command() -> None:
    """``make demo`` (the README's first command, not run by the test above) runs the PyTorch quick start's
    2-replica command, into demo-outputs/ instead of its --output-dir."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\ndemo: venv-pytorch\n", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ")
    [line] = [line for line in recipe.splitlines() if "-m entrypoint" in line]
    made = shlex.split(line.replace("$(TORCH_VENV)/bin/python", "python").replace("$(DEMO_DIR)", "DIR"))
    readme = [c for b in runnable("pytorch") for c in b.commands if c.words[3:5] == ["local", "--workers"]]
    assert readme, "the PyTorch quick start has no `local --workers` command"
    shown = [w if w != readme[0].job_dir else "DIR" for w in readme[0].words]
    assert made == shown, f"make demo runs {made}\nthe README shows {shown}"
    first = README.read_text().split("```", 2)[1]
    assert [line.split("#")[0].strip() for line in first.strip().splitlines()] == list(SETUP)


def test_the_fresh_clone_holds_no_outputs_of_this_checkout(tmp_path: Path) -> None:
    """The directory the README runs in has this checkout's code and none of what runs wrote here (outputs/,
    test-logs/...), and its .venv/ only links environments."""
    clone = fresh_clone(tmp_path)
    names = {p.name for p in clone.iterdir()}
    assert {"README.md", "Makefile", "entrypoint", "trainers", ".venv"} <= names
    assert not names & (UNTRACKED - {".venv"})
    assert all(p.is_symlink() for p in (clone / ".venv").iterdir())
    assert os.path.realpath(clone / ".venv" / Path(sys.prefix).name) == os.path.realpath(sys.prefix)
