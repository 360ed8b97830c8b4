"""The suite's GCS emulator (``tests/gcs_server.py``: gcp-storage-emulator with Cloud Storage's preconditions) with
every object download it serves counted: one line per read, ``<unix time> <object name>``, appended to the file
named by ``BENCH_GCS_READS``. What a job reads through the storage seam on ``gs://`` is what this server sends.

    BENCH_GCS_READS=reads.txt python -m bench.gcs_reads start --host 127.0.0.1 --port N --default-bucket B --quiet

``count_reads`` reads such a file back for a window of time.
"""

from __future__ import annotations

import importlib
import os
import runpy
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

READS = "BENCH_GCS_READS"
_WRITING = threading.Lock()


def counted(handler: Callable[..., Any], where: Path) -> Callable[..., Any]:
    """``handler`` (the emulator's download), first appending the object's name and the time to ``where``."""

    def download(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        with _WRITING, where.open("a") as out:
            out.write(f"{time.time():.3f} {request.params.get('object_id', '?')}\n")
        return handler(request, response, storage, *args, **kwargs)

    return download


def install(where: Path) -> None:
    """Count every route that serves an object's bytes (the download routes, and ``get`` with ``alt=media``)."""
    server = importlib.import_module("gcp_storage_emulator.server")  # untyped: imported by name
    objects: Any = importlib.import_module("gcp_storage_emulator.handlers.objects")
    original = objects.download
    wrapped = counted(original, where)
    for _pattern, methods in server.HANDLERS:
        for method, handler in list(methods.items()):
            if handler is original:
                methods[method] = wrapped
    objects.download = wrapped  # what objects.get calls for alt=media


def count_reads(where: Path, start: float, end: float, under: str = "") -> list[str]:
    """The objects (whose name contains ``under``) read between ``start`` and ``end`` (unix times)."""
    if not where.exists():
        return []
    found = []
    for line in where.read_text().splitlines():
        when, _, name = line.partition(" ")
        if start <= float(when) <= end and under in name:
            found.append(name)
    return found


if __name__ == "__main__":
    importlib.import_module("tests.gcs_server").install()  # Cloud Storage's preconditions, as the suite runs it
    install(Path(os.environ[READS]))
    runpy.run_module("gcp_storage_emulator", run_name="__main__", alter_sys=True)
