"""A job's run args (what follows ``job ... --``): parsed as ``run`` will parse them, without echoing values.

The args are ``run``'s options, then their own ``--`` and the user's code's arguments
(``planning.runargs.split_user_args`` splits them, here as in ``run``). A misspelt option fails when the job
is written, not after its machines are paid for; errors name options, never their values (they may be secrets).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import NoReturn

from entrypoint.errors import ConfigError
from entrypoint.jobs.images import parse_image
from entrypoint.options import RunOptions
from entrypoint.planning.runargs import add_run_arguments, options_from_namespace, split_user_args

# argparse names a failed conversion by its function: say what the value must be instead.
_TYPE_WORDS = {"int": "a whole number", "float": "a number", "positive_int": "a whole number >= 1",
               "non_negative_int": "a whole number >= 0", "positive_float": "a number > 0",
               "non_negative_float": "a number >= 0"}


def readable(message: str) -> str:
    """An argparse error without values (they may be secrets) or internal names: what is wrong, by option."""
    message = re.sub(r"invalid (\w+) value(: '.*?')?",
                     lambda m: f"expects {_TYPE_WORDS.get(m[1], m[1].strip('_').replace('_', ' '))}", message)
    message = re.sub(r"invalid choice: '.*?' \(choose from (.*)\)", r"expects one of \1", message)
    message = re.sub(r"(value|choice): '.*?'", r"\1", message)
    return re.sub(r", got .*$", "", message)  # ArgumentTypeError texts end with the value


class _RunArgsParser(argparse.ArgumentParser):
    """``run``'s parser, failing with a ConfigError whose text never carries an argument's value."""

    def __init__(self, source: str) -> None:
        super().__init__(prog="run", add_help=False, exit_on_error=False)
        self.source = source

    def error(self, message: str) -> NoReturn:
        """Name the options, never their values (they may be secrets)."""
        if message.startswith("unrecognized arguments:"):
            names = sorted({a.split("=", 1)[0] for a in message.split(":", 1)[1].split() if a.startswith("-")})
            message = (f"not accepted by run: {', '.join(names) or 'positional arguments'} "
                       "(user arguments go after '--')")
        raise ConfigError(self.source, f"run args: {readable(message)}")


def run_options(args: Sequence[str], source: str) -> RunOptions:
    """The run args as ``run`` will read them (its options, and the user's arguments after their ``--``)."""
    ours, user_args = split_user_args(args)
    parser = _RunArgsParser(source)
    add_run_arguments(parser)
    try:
        return options_from_namespace(parser.parse_args(ours), user_args)
    except argparse.ArgumentError as exc:  # exit_on_error=False raises some errors instead of calling error()
        parser.error(str(exc))


def with_run_option(run_args: tuple[str, ...], option: str, value: str) -> tuple[str, ...]:
    """``run_args`` with ``option value`` added before their own ``--`` (where the user's arguments start)."""
    ours, user_args = split_user_args(run_args)
    return (*ours, option, value, *(("--", *user_args) if "--" in run_args else ()))


def infer_framework(explicit: str | None, image_uri: str, from_args: str | None) -> str | None:
    """--framework, else run's own --framework, else the image's name (``.../pytorch-cpu:tag``)."""
    if explicit and from_args and explicit != from_args:
        raise ConfigError("--framework", f"{explicit} here but the run args say --framework {from_args}")
    return explicit or from_args or parse_image(image_uri).framework()


def framework_args(run_args: tuple[str, ...], image: str, explicit: str | None,
                   in_args: str | None) -> tuple[tuple[str, ...], list[str]]:
    """The run args saying ``--framework`` when ``job`` was given one that neither the args nor the image's name say:
    the spec then says what it runs. Without it ``local --spec``, which knows the image only by its name, ran a Horovod
    job on an image named otherwise as PyTorch DDP, and an image whose own TRAINER_FRAMEWORK differs would run that."""
    if explicit is None or in_args is not None or parse_image(image).framework() == explicit:
        return run_args, []
    return with_run_option(run_args, "--framework", explicit), [
        f"the image's name does not say {explicit}: the args say --framework {explicit} (local --spec and every "
        "replica read it)"]
