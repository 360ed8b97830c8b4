"""pip's own configuration as the flags of `uv pip install`: the Makefile installs each image venv's lock with uv
(docs/testing.md, "Cut for issue 55's bar: the venvs and the images"), from the sources pip would use.

uv reads neither pip's configuration files nor its PIP_* variables, so what `pip config list` shows of the index, the
extra indexes, the find-links directories and the constraint files is passed on, a variable over a file as pip has it;
and uv is told to weigh every index alike, as pip does (uv's default takes a package from the first index that has
it: a local index's older absl-py hid PyPI's pinned one). Standard library only; one flag a line would break no path
with spaces, so the flags are printed for a shell, quoted.

    python3 tests/uv_flags.py          # --index-strategy unsafe-best-match --find-links /opt/wheels ...
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}
# pip's precedence: a PIP_* variable over the install section over the global one
SCOPES = (":env:", "install", "global")
LINE = re.compile(r"([:\w]+)\.([a-z-]+)='(.*)'")


def flags(listing: str) -> list[str]:
    """The uv flags for a `pip config list` output."""
    found: dict[tuple[str, str], str] = {}
    for line in listing.splitlines():
        match = LINE.fullmatch(line.strip())
        if match and match.group(2) in FLAGS:
            found[match.group(1), match.group(2)] = match.group(3)
    out = ["--index-strategy", "unsafe-best-match"]
    for key, flag in FLAGS.items():
        value = next((found[scope, key] for scope in SCOPES if (scope, key) in found), "")
        for item in dict.fromkeys(value.split()):
            out += [flag, item]
    return out


def main() -> int:
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=60, check=False).stdout
    print(shlex.join(flags(listing)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
