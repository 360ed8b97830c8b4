"""The exported model: ``model.safetensors``, consolidated tensor by tensor, for every strategy.

``model.safetensors`` is the format users load with ``safetensors.torch.load_file`` and transformers. It is
written by streaming: the header (every tensor's name, dtype, shape and offsets) is known from the state dict's
global shapes before any data moves, then each tensor is gathered in turn (``DTensor.full_tensor()``: a
collective every rank joins in the same order) and the chief appends its bytes. No process ever holds more
than the largest tensor plus the write buffer: a sharded model is never gathered whole on one rank.

A replicated model (DDP, Horovod, one process) also keeps ``model.pt`` (the whole module) and
``state_dict.pt``. A module's own ``export(model, model_dir, ctx)`` hook replaces all of this (on the chief for a
replicated model; on every rank for a sharded one, whose hook gathers what it needs).
"""

from __future__ import annotations

import json
import math
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from entrypoint.outputs import storage
from entrypoint.outputs.storage import Location, RemotePath
from entrypoint.pytorch.checkpoint_io import output_error, write_file

SAFETENSORS_FILE = "model.safetensors"
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


def write_safetensors(state: dict[str, torch.Tensor], target: Location, writer: bool) -> None:
    """Stream ``state`` into ``target`` one tensor at a time; every rank calls this, only the ``writer`` writes."""
    entries = [(name, value.dtype, tuple(value.shape)) for name, value in state.items()]
    out: IO[bytes] | None = None
    try:
        if writer:
            target.parent.mkdir(parents=True, exist_ok=True)
            out = target.open("wb")
            out.write(safetensors_header(entries))
        for name, value in state.items():
            full = _full(value)
            if out is not None:
                out.write(full.view(torch.uint8).numpy().data if full.numel() else b"")
            del full, name
        if out is not None:
            out.close()
            out = None
    except Exception as exc:
        if out is not None:
            out.close()
        if writer:
            target.unlink(missing_ok=True)
        raise output_error(exc, target) from None


def export_model(model: torch.nn.Module, model_dir: Location, custom: Callable[..., Any] | None, ctx: Any,
                 sharded: bool = False) -> None:
    """The final export (every rank calls it for a sharded model; only the chief for a replicated one).

    The user's ``export`` hook, else ``model.safetensors`` (and, for a replicated model, ``model.pt`` and
    ``state_dict.pt``). On an object store the user's hook writes into a local staging directory (it may call
    ``torch.save`` on paths, as on disk), uploaded to ``model_dir`` once the hook returns.
    """
    chief = bool(getattr(ctx, "is_chief", True))
    if isinstance(model_dir, RemotePath) and callable(custom):
        with tempfile.TemporaryDirectory(prefix="trainer-export-") as staging:
            custom(model, Path(staging), ctx)
            if chief:
                try:
                    storage.upload_tree(Path(staging), model_dir)
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
    if not sharded:
        write_file(state, model_dir / "state_dict.pt")
        write_file(model, model_dir / "model.pt")
