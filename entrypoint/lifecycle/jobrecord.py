"""What a job ran with: its arguments, recorded in the job dir; a later run that differs says so before training.

A run on a job dir that holds checkpoints resumes from them: the platform's restarts repeat the same arguments,
so that is what they need. A rerun with other arguments resumes too, silently: a finished 2-epoch job rerun with
``--epochs 1`` trains nothing and exports the old model again, and a changed ``-- --lr`` is overridden by the
optimizer state the checkpoint saved. So the chief writes ``<job dir>/job.json`` when it starts (the options that
shape what is trained, and the user's arguments with secret values hidden) and marks it finished when the job
succeeds; a run whose arguments differ from the recorded ones logs one warning naming each difference and what
resuming means for it, then records its own. Nothing is refused: raising ``--epochs`` to train on is a rerun too.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import asdict, dataclass, replace
from typing import Any

from entrypoint.options import RunOptions
from entrypoint.outputs import redaction, storage
from entrypoint.outputs.locations import local_path
from entrypoint.outputs.storage import Location, StorageError

log = logging.getLogger("entrypoint")
RECORD = "job.json"
SCHEMA_VERSION = 1
# The options that shape what is trained (the rest, timeouts, log lines, checkpoint cadence, change nothing of it).
SHAPING = ("framework", "module", "script", "strategy", "epochs", "batch_size", "seed", "bf16", "clip_grad_norm",
           "on_nonfinite")
POSITIONAL = "(positional arguments)"


@dataclass(frozen=True)
class JobRecord:
    """The recorded run: its shaping options, the user's arguments by flag (secrets hidden), whether it finished."""

    options: dict[str, Any]
    user_args: dict[str, str]
    finished: bool = False
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def of(cls, options: RunOptions, secrets: frozenset[str]) -> JobRecord:
        """This run's record (a secret value in the user's arguments is stored as ``***``)."""
        shaping = {name: getattr(options, name) for name in SHAPING}
        return cls(shaping, by_flag([redaction.hide(arg, secrets) for arg in options.user_args]))


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
             for name in SHAPING if old.options.get(name) != new.options.get(name)]
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


def start(job_dir: str, options: RunOptions, secrets: frozenset[str]) -> JobRecord:
    """Compare this run with the recorded one (one warning when they differ), then record this one."""
    mine, before = JobRecord.of(options, secrets), read(job_dir)
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
