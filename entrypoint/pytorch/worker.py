"""One training process of the hooks loop: ``python -m entrypoint.pytorch.worker '<options json>'``.

Started by the elastic launcher (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_* set) or run in-process
under torchrun / mpirun. Exit codes follow docs/EXIT_CODES.md.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from entrypoint.environments import resolve
from entrypoint.errors import ExitCode, RetryableError, TrainerError
from entrypoint.options import RunOptions
from entrypoint.progress import setup_logging

_TIMEOUT_HINTS = ("timed out", "timeout", "connection reset", "connection closed", "peer")


def encode_options(options: RunOptions, module: str) -> str:
    """The worker's one argument: the run options and the hooks module, as JSON."""
    return json.dumps({**asdict(options), "module": module})


def decode_options(payload: str) -> tuple[RunOptions, str]:
    """Inverse of ``encode_options``."""
    data: dict[str, Any] = json.loads(payload)
    module = data.pop("module")
    data["user_args"] = tuple(data.get("user_args", ()))
    return RunOptions(**data), module


def run(options: RunOptions, module: str) -> None:
    """Join the process group, run the loop, leave the group."""
    import torch
    import torch.distributed as dist

    from entrypoint.pytorch.collectives import TorchDistributed
    from entrypoint.pytorch.loop import Trainer

    topo = resolve()
    process = topo.process
    rank = process.rank if process else 0
    world = process.world_size if process else 1
    setup_logging(f"[rank {rank}/{world}] ")
    cuda = torch.cuda.is_available()
    local_rank = process.local_rank if process else 0
    if cuda:
        torch.cuda.set_device(local_rank)
    backend = "nccl" if cuda else "gloo"
    joined = False
    if process is not None:
        dist.init_process_group(
            backend, timeout=timedelta(seconds=options.timeout),
            device_id=torch.device("cuda", local_rank) if cuda else None,
        )
        joined = True
    try:
        Trainer(options, module, topo, TorchDistributed(backend)).fit()
    finally:
        if joined:
            dist.destroy_process_group()


def main(argv: Sequence[str] | None = None, runner: Callable[[RunOptions, str], None] | None = None) -> int:
    """Run one worker (``runner``: this module's ``run`` or Horovod's); map failures to exit codes."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        options, module = decode_options(args[0])
        (runner or run)(options, module)
        return ExitCode.OK
    except TrainerError as exc:
        print(f"entrypoint: error: {exc}", file=sys.stderr, flush=True)
        return int(exc.exit_code)
    except Exception as exc:
        name = type(exc).__name__
        text = str(exc).lower()
        if name.startswith("Dist") and any(h in text for h in _TIMEOUT_HINTS):
            print(f"entrypoint: error: a collective failed, a peer is gone or timed out ({name})", file=sys.stderr)
            return int(RetryableError("").exit_code)
        traceback.print_exc()
        print(f"entrypoint: error: the user's code failed: {name}: {str(exc)[:200]}", file=sys.stderr, flush=True)
        return ExitCode.USER_CODE


if __name__ == "__main__":
    sys.exit(main())
