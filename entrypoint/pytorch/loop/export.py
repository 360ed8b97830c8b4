"""The exported model: ``model.safetensors``, consolidated tensor by tensor, for every strategy.

``model.safetensors`` is the format users load with ``safetensors.torch.load_file`` and transformers. It is
written by streaming: the header (every tensor's name, dtype, shape and offsets) is known from the state dict's
global shapes before any data moves, then the tensors follow in turn, every rank taking part in the same order.
A tensor sharded on its first dimension (FSDP, and HSDP's first replica) is written shard by shard: its bytes are
its shards' bytes in mesh order, so the chief writes its own shard, then receives each other rank's and appends it
(point to point), holding at most one shard beside the write buffer. Any other tensor is gathered whole
(``DTensor.full_tensor()``, or the tensor itself when replicated) and appended. A sharded model is never gathered
whole on one rank, and the chief's host memory grows by at most the largest shard (or unsharded tensor).

How a layout exports is an ``Export`` (``layout.py`` holds one): ``WHOLE``, a replicated model (DDP, Horovod, one
process), is exported by the chief alone from its whole copy on the host, which also keeps ``model.pt`` (the whole
module) and ``state_dict.pt``; ``SHARDS``, a sharded model, by every rank, each streaming its shards. A module's own
``export(model, model_dir, ctx)`` hook replaces the files (on the ranks that take part: every rank of a sharded
model, whose hook gathers what it needs).
"""

from __future__ import annotations

import json
import math
import os
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from entrypoint.errors import Interrupted
from entrypoint.outputs import storage
from entrypoint.outputs.storage import Location, RemotePath
from entrypoint.pytorch.checkpoints.checkpoint_io import output_error, write_file

SAFETENSORS_FILE = "model.safetensors"


@dataclass(frozen=True)
class Export:
    """How a layout's model is exported: by every rank (each its shards, streamed to the chief) or by the chief alone
    from its whole copy on the host, and which files of the whole model it keeps beside ``model.safetensors``."""

    every_rank: bool
    beside: tuple[str, ...]  # "state_dict.pt" (the state dict), "model.pt" (the whole module)

    def model(self, model: torch.nn.Module, is_chief: bool) -> torch.nn.Module | None:
        """``model`` as this rank exports it (in eval mode; the chief's whole copy on the host); None where this rank
        takes no part."""
        if self.every_rank:
            return model.eval()
        return model.to("cpu").eval() if is_chief else None


WHOLE = Export(every_rank=False, beside=("state_dict.pt", "model.pt"))  # a replicated model: the chief's copy
SHARDS = Export(every_rank=True, beside=())  # a sharded model: never whole on one rank
_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}


def safetensors_header(entries: list[tuple[str, torch.dtype, tuple[int, ...]]]) -> bytes:
    """The file's first bytes: the header's length (8 bytes, little-endian) and the JSON header, padded to 8."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in entries:
        if dtype not in _DTYPES:
            raise ValueError(f"{name}: safetensors has no dtype for {dtype}")
        size = dtype.itemsize * math.prod(shape)
        header[name] = {"dtype": _DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _full(value: torch.Tensor) -> torch.Tensor:
    """The whole tensor on this process's host (a collective for a sharded ``DTensor``)."""
    full = value.full_tensor() if hasattr(value, "full_tensor") else value
    return full.detach().contiguous().cpu()


def _bytes(value: torch.Tensor) -> Any:
    """A contiguous host tensor's bytes, as a buffer (no copy)."""
    return value.reshape(-1).view(torch.uint8).numpy().data if value.numel() else b""


def row_shards(value: Any) -> list[int] | None:
    """For a ``DTensor`` sharded on dimension 0 over one mesh dimension (replicated over any other): the global ranks
    holding the first replica's shards, in shard order; None for any other tensor or layout."""
    placements = getattr(value, "placements", None)
    if placements is None or value.dim() == 0:
        return None
    from torch.distributed.tensor import Replicate, Shard

    sharded = [i for i, p in enumerate(placements) if isinstance(p, Shard)]
    if len(sharded) != 1 or placements[sharded[0]].dim != 0 or \
            not all(isinstance(p, (Shard, Replicate)) for p in placements):
        return None
    grid = value.device_mesh.mesh
    first = tuple(slice(None) if i == sharded[0] else 0 for i in range(grid.dim()))
    return [int(r) for r in grid[first].reshape(-1).tolist()]


def shard_rows(total: int, shards: int, index: int) -> int:
    """Rows of shard ``index`` of ``total`` rows cut in ``shards`` (``torch.chunk``'s cut, as FSDP2's and DTensor's)."""
    size = -(-total // shards) if shards else 0
    return max(0, min(total, (index + 1) * size) - index * size)


def _stream_rows(value: Any, ranks: list[int], out: IO[bytes] | None) -> None:
    """A row-sharded tensor, shard by shard: the writer (``ranks[0]``) appends its own, then each other's in turn."""
    import torch.distributed as dist

    me = dist.get_rank()
    if me not in ranks:
        return  # another replica's copy (HSDP): the first one is written
    local = value.to_local().detach()
    total, count = int(value.shape[0]), len(ranks)
    index = ranks.index(me)
    if int(local.shape[0]) != shard_rows(total, count, index):
        raise RuntimeError(f"shard {index} of a tensor of {total} rows has {local.shape[0]} rows, not "
                           f"{shard_rows(total, count, index)}: not the torch.chunk layout the export streams")
    if index > 0:
        if local.numel():
            dist.send(local.contiguous(), dst=ranks[0])
        return
    if out is not None:
        out.write(_bytes(local.contiguous().cpu()))
    for other in range(1, count):
        rows = shard_rows(total, count, other)
        if rows == 0:
            continue
        shard = torch.empty((rows, *value.shape[1:]), dtype=local.dtype, device=local.device)
        dist.recv(shard, src=ranks[other])
        if out is not None:
            out.write(_bytes(shard.cpu()))
        del shard


def _append(value: Any, out: IO[bytes] | None, writer_rank: int) -> None:
    """One tensor's bytes appended by the writer; every rank calls this for every tensor, in the same order."""
    ranks = row_shards(value)
    if ranks is not None and ranks[0] == writer_rank:
        _stream_rows(value, ranks, out)
        return
    full = _full(value)
    if out is not None:
        out.write(_bytes(full))


def partial(target: Location) -> Location:
    """Where ``target`` is written until it is whole: on a disk a hidden name beside it, renamed over it at the end
    (a reader, or a rerun's export, never sees a torn file at ``target``); on a store the object itself, which
    appears only once its upload is finalized."""
    return target if isinstance(target, RemotePath) else target.with_name(f".{target.name}.partial")


def publish(written: Location, target: Location) -> None:
    """``written`` (``partial(target)``, whole) becomes ``target`` at once."""
    if written != target:
        os.replace(str(written), str(target))


def write_safetensors(state: dict[str, torch.Tensor], target: Location, writer: bool) -> None:
    """Stream ``state`` into ``target`` one tensor at a time; every rank calls this, only the ``writer`` writes."""
    entries = [(name, value.dtype, tuple(value.shape)) for name, value in state.items()]
    out: IO[bytes] | None = None
    writer_rank = _writer_rank(state, writer)
    written = partial(target)
    try:
        if writer:
            target.parent.mkdir(parents=True, exist_ok=True)
            out = written.open("wb")
            out.write(safetensors_header(entries))
        for value in state.values():
            _append(value, out, writer_rank)
        if out is not None:
            out.close()
            out = None
            publish(written, target)
    except Exception as exc:
        if out is not None:
            out.close()
        if writer:
            written.unlink(missing_ok=True)
        raise output_error(exc, target) from None


def _writer_rank(state: dict[str, torch.Tensor], writer: bool) -> int:
    """The writer's global rank: the chief, rank 0 in every loop (shards stream to it)."""
    if writer and any(row_shards(v) is not None for v in state.values()):
        import torch.distributed as dist

        if dist.get_rank() != 0:
            raise RuntimeError(f"the export's writer is rank {dist.get_rank()}; sharded tensors stream to rank 0")
    return 0


def export_model(model: torch.nn.Module, model_dir: Location, custom: Callable[..., Any] | None, ctx: Any,
                 how: Export = WHOLE) -> None:
    """The final export (on the ranks ``how`` says: every rank of a sharded model; only the chief of a replicated one).

    The user's ``export`` hook, else ``model.safetensors`` (and the files ``how`` keeps beside it: for a replicated
    model ``model.pt`` and ``state_dict.pt``). On an object store the user's hook writes into a local staging
    directory (it may call ``torch.save`` on paths, as on disk), uploaded to ``model_dir`` once the hook returns.
    """
    chief = bool(getattr(ctx, "is_chief", True))
    if isinstance(model_dir, RemotePath) and callable(custom):
        with tempfile.TemporaryDirectory(prefix="trainer-export-") as staging:
            custom(model, Path(staging), ctx)
            if chief:
                try:
                    storage.upload_tree(Path(staging), model_dir)
                except Interrupted:  # a stop during the export: the final step is committed, the restart exports
                    raise
                except BaseException as exc:
                    raise output_error(exc, model_dir) from None
        return
    if chief:
        try:
            model_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise output_error(exc, model_dir) from None
    if callable(custom):
        custom(model, model_dir, ctx)
        return
    state = model.state_dict()
    write_safetensors(state, model_dir / SAFETENSORS_FILE, chief)
    whole = {"state_dict.pt": state, "model.pt": model}
    for name in how.beside:
        write_file(whole[name], partial(model_dir / name))
        try:
            publish(partial(model_dir / name), model_dir / name)
        except OSError as exc:
            raise output_error(exc, model_dir / name) from None
