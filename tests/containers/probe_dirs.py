"""Run inside an image by the container tests, through its ENTRYPOINT in script mode: who runs, where it writes.

    <image> --script /probe/probe_dirs.py -- OUTPUT_VOLUME      (writes OUTPUT_VOLUME/probe.json)

Uses only the standard library and the entrypoint's context API, so it runs in every image.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
import tempfile
from pathlib import Path

from entrypoint import context


def writable(folder: Path) -> bool:
    """Whether a file can be created (and removed) in ``folder``, creating the folder if needed."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
        return True
    except OSError:
        return False


volume = Path(sys.argv[1])
context.report_metric("probe", 1.0, 1)  # the chief's tuning metric, where cloudml-hypertune writes it
metric_file = Path(os.environ.get("CLOUD_ML_HP_METRIC_FILE", "/tmp/hypertune/output.metrics"))
report = {
    "uid": os.getuid(),
    "gid": os.getgid(),
    "user": pwd.getpwuid(os.getuid()).pw_name,
    "cwd": os.getcwd(),
    "is_chief": context.is_chief(),
    "writable": {
        "job_dir": writable(Path("outputs")),  # the default job dir, ./outputs under /app
        "model_dir": writable(Path(context.model_dir())),
        "checkpoint_dir": writable(Path(context.checkpoint_dir())),
        "tmp": writable(Path(tempfile.gettempdir())),
        "hypertune_dir": writable(metric_file.parent),
        "home": writable(Path.home()),
        "volume": writable(volume),
    },
    "hypertune_file_written": metric_file.is_file(),
}
(volume / "probe.json").write_text(json.dumps(report, indent=2))
