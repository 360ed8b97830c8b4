"""What the DataLoader workers' fork server imports first (``data.py``): torch, and stop signals ignored.

The server is started by a training process, in its process group: a preemption sent to the whole group (tini -g,
``local``, Kubernetes) reaches it too, and must neither end it nor the workers it forks (they inherit the ignored
signals, as ``shield_loader_worker`` sets them); it ends when its training process does (the server's own pipe),
its workers with it. Imported anywhere else, the module does nothing but import torch.
"""

from __future__ import annotations

import sys

import torch  # noqa: F401  (every worker forked from the server finds it imported)

from entrypoint.lifecycle.signals import shield_loader_worker


def in_fork_server() -> bool:
    """Whether this process is multiprocessing's fork server (``python -c 'from multiprocessing.forkserver ...'``)."""
    return sys.argv == ["-c"] and "multiprocessing.forkserver" in sys.modules


if in_fork_server():
    shield_loader_worker(0)  # as each worker does: stop signals ignored, killed when its training process ends
