"""What a job ran with: its arguments, recorded in the job dir; a later run that differs says so before training.

A run on a job dir that holds checkpoints resumes from them: the platform's restarts repeat the same arguments,
so that is what they need. A rerun with other arguments resumes too, silently: a finished 2-epoch job rerun with
``--epochs 1`` trains nothing and exports the old model again, and a changed ``-- --lr`` is overridden by the
optimizer state the checkpoint saved. So the chief writes ``<job dir>/job.json`` when it starts (the options that
shape what is trained, and the user's arguments with secret values hidden) and marks it finished when the job
succeeds; a run whose arguments differ from the recorded ones logs one warning naming each difference and what
resuming means for it, then records its own: raising ``--epochs`` to train on is a rerun too. What is refused is
another job: a run of another framework or other code (``--module``, ``--script``) on a job dir whose record names
different ones would load that job's checkpoints into a model they were not saved from (a wall of ``Unexpected
key(s) in state_dict``), so ``run`` refuses it with one line naming ``--job-dir`` before anything runs, and so does
``local`` before any replica starts (``refusal``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from entrypoint.cluster.environments.settings import read_settings
from entrypoint.errors import ConfigError
from entrypoint.options import RunOptions
from entrypoint.outputs import redaction, storage
from entrypoint.outputs.locations import local_path
from entrypoint.outputs.storage import Location, StorageError
from entrypoint.planning.plan import choose_framework
from entrypoint.planning.runargs import parse_options
from entrypoint.planning.usercode import UserCode, find_code

log = logging.getLogger("entrypoint")
RECORD = "job.json"
SCHEMA_VERSION = 1
# The options that shape what is trained (the rest, timeouts, log lines, checkpoint cadence, change nothing of it).
SHAPING = ("framework", "module", "script", "strategy", "epochs", "batch_size", "seed", "bf16", "clip_grad_norm",
           "on_nonfinite")
POSITIONAL = "(positional arguments)"
# What the job is: its framework and its code. Recorded as the run resolved them (``--framework`` not given is the
# one the plan chose, ``$TRAINER_MODULE`` the module it names); a run that differs in either is another job.
IDENTITY = ("framework", "module", "script")


@dataclass(frozen=True)
class JobRecord:
    """The recorded run: its shaping options, the user's arguments by flag (secrets hidden), whether it finished."""

    options: dict[str, Any]
    user_args: dict[str, str]
    finished: bool = False
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def of(cls, options: RunOptions, secrets: frozenset[str], framework: str | None = None,
           code: UserCode | None = None) -> JobRecord:
        """This run's record (a secret value in the user's arguments is stored as ``***``), with the framework and
        the code the plan resolved, when given."""
        shaping = {name: getattr(options, name) for name in SHAPING}
        shaping.update(identity(framework or options.framework, code))
        return cls(shaping, by_flag([redaction.hide(arg, secrets) for arg in options.user_args]))

    def code(self) -> str | None:
        """The recorded code, ``module trainers.digits_torch`` or ``script train.py`` (None: not recorded)."""
        return _code(self.options.get("module"), self.options.get("script"))


def _code(module: Any, script: Any) -> str | None:
    """``module M`` or ``script S`` (``./train.py`` is ``train.py``), None when neither is known."""
    return f"script {os.path.normpath(script)}" if script else f"module {module}" if module else None


def identity(framework: str | None, code: UserCode | None) -> dict[str, str | None]:
    """The identity keys of a record for ``framework`` and ``code`` (only those known)."""
    found: dict[str, str | None] = {"framework": framework} if framework else {}
    if code is not None:
        script = code.kind == "script"
        found.update(module=None if script else code.target, script=code.target if script else None)
    return found


def by_flag(args: list[str]) -> dict[str, str]:
    """The user's arguments by flag: ``--lr 0.1`` and ``--lr=0.1`` give ``{"--lr": "0.1"}``, a switch ``""``."""
    found: dict[str, str] = {}
    positional: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-") and len(arg) > 1:
            flag, eq, value = arg.partition("=")
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("-"):
                value, i = args[i + 1], i + 1
            found[flag] = value
        else:
            positional.append(arg)
        i += 1
    if positional:
        found[POSITIONAL] = " ".join(positional)
    return found


def differences(old: JobRecord, new: JobRecord) -> list[str]:
    """Each argument whose value differs, ``--epochs 2 -> 1`` (user arguments marked ``after --``)."""
    found = [f"--{name.replace('_', '-')} {_shown(old.options.get(name))} -> {_shown(new.options.get(name))}"
             for name in SHAPING if name not in IDENTITY and old.options.get(name) != new.options.get(name)]
    for flag in sorted(set(old.user_args) | set(new.user_args)):
        before, after = old.user_args.get(flag), new.user_args.get(flag)
        if before != after:
            found.append(f"{flag} (after --) {_shown(before, switch=True)} -> {_shown(after, switch=True)}")
    return found


def _shown(value: Any, switch: bool = False) -> str:
    if value is None:
        return "not given"
    if switch and value == "":
        return "given"
    return str(value)


def _path(job_dir: str) -> Location:
    return storage.path(local_path(job_dir)) / RECORD


def read(job_dir: str) -> JobRecord | None:
    """The job's recorded run; None when there is none (or it cannot be read)."""
    try:
        data = json.loads(_path(job_dir).read_text())
        return JobRecord(dict(data["options"]), {str(k): str(v) for k, v in dict(data["user_args"]).items()},
                         bool(data.get("finished")))
    except (OSError, ValueError, TypeError, KeyError, AttributeError, StorageError):
        return None


def write(job_dir: str, record: JobRecord) -> None:
    """Record ``record`` (best effort: a job dir that cannot take it fails the run elsewhere, clearly)."""
    with contextlib.suppress(OSError, StorageError):
        _path(job_dir).parent.mkdir(parents=True, exist_ok=True)
        _path(job_dir).write_text(json.dumps(asdict(record), sort_keys=True, default=str))


def refusal(job_dir: str, framework: str, code: UserCode | None) -> ConfigError | None:
    """Why a run of ``framework`` and ``code`` must not run on ``job_dir``: its record names another framework or
    other code (a record that does not say, an older one's ``--framework`` not given, is no other job). None: go."""
    before = read(job_dir)
    if before is None:
        return None
    old_framework, old_code = before.options.get("framework"), before.code()
    mine = identity(framework, code)
    new_code = _code(mine.get("module"), mine.get("script"))
    framework_differs = bool(old_framework) and old_framework != framework
    code_differs = old_code is not None and new_code is not None and old_code != new_code
    if not (framework_differs or code_differs):
        return None
    shown = [(f"framework {old_framework}", f"framework {framework}")] if framework_differs else []
    shown += [(str(old_code), str(new_code))] if code_differs else []
    was, now = (", ".join(pair[i] for pair in shown) for i in (0, 1))
    return ConfigError("--job-dir", f"{job_dir} holds another job: its {RECORD} says {was}, and this run is {now}, "
                       "which would resume from that job's checkpoints; give this run a job dir of its own (--job-dir; "
                       "local: --output-dir), or empty that one to start afresh there")


def refusal_of_run(job_dir: str, run_args: Sequence[str], environ: Mapping[str, str]) -> ConfigError | None:
    """``refusal`` for the ``run`` arguments ``run_args`` in the environment ``environ`` (``local``, before any replica
    starts, for its chief's command; that run's own job dir when it names none). None also where the arguments do not
    plan (the replica says what is wrong) or name their own outputs (each replica checks its own)."""
    try:
        options = parse_options("run", run_args)
        if options.job_dir or options.model_dir:
            return None
        settings = read_settings(environ)
        framework = choose_framework(options.framework, settings)
        code = find_code(options.module or settings.module, options.script)
    except ConfigError:
        return None
    return refusal(job_dir, framework, code)


def start(job_dir: str, options: RunOptions, secrets: frozenset[str], framework: str | None = None,
          code: UserCode | None = None) -> JobRecord:
    """Compare this run with the recorded one (one warning when they differ), then record this one (its framework
    and code as the plan resolved them, when given)."""
    mine, before = JobRecord.of(options, secrets, framework, code), read(job_dir)
    if before is not None:
        changed = differences(before, mine)
        if changed:
            log.warning("%s", warning(job_dir, changed, before.finished))
        elif before.finished:
            log.info("job dir %s: the job finished already with these arguments; this run resumes from its newest "
                     "checkpoint", job_dir)
    write(job_dir, mine)
    return mine


def warning(job_dir: str, changed: list[str], finished: bool) -> str:
    """The one line a rerun with other arguments gets."""
    state = ("The job finished there, so this run resumes from its final checkpoint: fewer epochs train nothing more "
             "and export that model again. " if finished else "")
    return (f"job dir {job_dir}: this run's arguments differ from the job's last run: {'; '.join(changed)}. {state}"
            "It resumes from the job's newest checkpoint, with the optimizer state saved there (its learning rate "
            "among it), so such changes may not take effect; give this run a new --job-dir to start afresh with "
            "them (--resume-from warm-starts from a checkpoint)")


def finished(job_dir: str, record: JobRecord) -> None:
    """The job succeeded: a rerun that differs is told it resumes a finished job."""
    write(job_dir, replace(record, finished=True))
