"""One Horovod training process of the hooks loop: ``python -m entrypoint.horovod.worker '<options json>'``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from entrypoint.environments import resolve
from entrypoint.errors import RetryableError
from entrypoint.options import RunOptions
from entrypoint.progress import setup_logging
from entrypoint.pytorch.worker import main as worker_main


def run(options: RunOptions, module: str) -> None:
    """hvd.init() (gloo rendezvous with the chief), pin the GPU, run the shared loop."""
    import horovod.torch as hvd
    import torch

    from entrypoint.horovod.collectives import HorovodCollectives
    from entrypoint.pytorch.loop import Trainer

    topo = resolve()
    try:
        hvd.init()
    except Exception as exc:  # gloo rendezvous failed: a peer never came or the chief is unreachable
        raise RetryableError(f"Horovod rendezvous failed within {int(options.timeout)}s: {exc}") from None
    setup_logging(f"[rank {hvd.rank()}/{hvd.size()}] ")
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
    try:
        Trainer(options, module, topo, HorovodCollectives()).fit()
    finally:
        hvd.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one Horovod worker with the PyTorch worker's option decoding and exit-code mapping."""
    return worker_main(sys.argv[1:] if argv is None else argv, runner=run)


if __name__ == "__main__":
    sys.exit(main())
