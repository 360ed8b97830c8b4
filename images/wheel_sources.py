"""Where the local builds get two wheels: torch's +cpu wheel from the host pip's find-links directories and
Horovod's from the host's wheel cache, both served on 127.0.0.1 as build arguments."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from build_common import IMAGES, ROOT, cache_dir, log
from debian_base import BASE_PYTHON

# The local wheel index is a build argument: a fixed port keeps it, and so the layer cache, the same. Each image
# has its own (WHEEL_PORT + its index in IMAGES), so images built side by side (make -j test) each serve their own.
WHEEL_PORT = int(os.environ.get("TRAINER_WHEEL_PORT", "38417"))


def wheel_port(image: str) -> int:
    """The port the wheels are served on while ``image`` builds."""
    return WHEEL_PORT + IMAGES.index(image)
# images/horovod/build_horovod_wheel.sh's cache: <key>/key.txt and <key>/horovod-*.whl per build key.
HOROVOD_CACHE_PATH = "horovod"  # where the index serves it


def lock_version(image: str, package: str) -> str | None:
    for line in (ROOT / "images" / image / "requirements-cpu.txt").read_text().splitlines():
        name, _, version = line.strip().partition("==")
        if name.lower() == package:
            return version
    return None


def find_links() -> list[Path]:
    """The host pip's find-links directories (`pip config list`, PIP_FIND_LINKS)."""
    values = os.environ.get("PIP_FIND_LINKS", "").split()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=60, check=False).stdout
        values += [v for m in re.finditer(r"find-links='([^']*)'", out) for v in m.group(1).split()]
    return [Path(v.removeprefix("file://")) for v in dict.fromkeys(values) if not v.startswith("http")]


def local_torch_wheel() -> Path | None:
    """torch's +cpu wheel of the lock's version for the base's Python, if the host has it."""
    version = lock_version("pytorch", "torch")
    tag = "cp" + BASE_PYTHON.replace(".", "")
    for folder in find_links():
        wheels = sorted(folder.glob(f"torch-{version}+cpu-{tag}-{tag}-*linux*x86_64.whl"))
        if wheels:
            return wheels[-1]
    return None


def horovod_wheel_cache() -> Path:
    """build_horovod_wheel.sh's wheel cache (TRAINER_WHEEL_CACHE, else under XDG_CACHE_HOME or ~/.cache)."""
    if os.environ.get("TRAINER_WHEEL_CACHE"):
        return Path(os.environ["TRAINER_WHEEL_CACHE"])
    return cache_dir() / "wheels"


@dataclass(frozen=True)
class WheelSources:
    """Where a local build gets its wheels: torch's index and Horovod's wheel cache (URLs, or None)."""

    torch_index: str | None = None
    horovod_cache: str | None = None


@contextlib.contextmanager
def wheel_index(wheel: Path | None, horovod_cache: Path | None = None,
                port: int = WHEEL_PORT) -> Iterator[WheelSources]:
    """Serve ``wheel`` as a one-package simple index and ``horovod_cache`` as it is, on 127.0.0.1:``port`` (the
    builds use the host network). The Horovod URL is given even for a cache that does not exist yet: the
    build then compiles, and the build argument (so the layer cache) stays the same either way."""
    if wheel is None and horovod_cache is None:
        yield WheelSources()
        return
    with tempfile.TemporaryDirectory(prefix="trainer-wheels-") as tmp:
        if wheel is not None:
            folder = Path(tmp) / "simple" / "torch"
            folder.mkdir(parents=True)
            (folder / wheel.name).symlink_to(wheel)
        if horovod_cache is not None:
            (Path(tmp) / HOROVOD_CACHE_PATH).symlink_to(horovod_cache, target_is_directory=True)

        class Quiet(http.server.SimpleHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

        handler = functools.partial(Quiet, directory=tmp)
        try:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        except OSError:
            log(f"port {port} is busy: serving the wheels on another one (the layer cache will miss)")
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        with server:
            threading.Thread(target=server.serve_forever, daemon=True).start()
            url = f"http://127.0.0.1:{server.server_address[1]}"
            yield WheelSources(f"{url}/simple/" if wheel is not None else None,
                               f"{url}/{HOROVOD_CACHE_PATH}/" if horovod_cache is not None else None)
            server.shutdown()
