"""``--init-from``: the model's first weights from a Hugging Face safetensors checkpoint, each rank reading its own.

A checkpoint as transformers saves it: a directory with ``model.safetensors``, or with
``model.safetensors.index.json`` and the files its ``weight_map`` names, or one ``.safetensors`` file; on a disk,
a FUSE mount or ``gs://`` (read through the storage seam, in byte ranges: nothing is downloaded whole).

No rank holds the whole model: ``build_model`` runs with its parameters on the meta device (``meta_parameters``:
buffers stay real, as a causal mask or rotary frequencies are computed there and not saved), the model is placed
(sharded, or moved to its device), then ``materialize`` gives every parameter its memory (``to_empty``, the
buffers copied back) and, when the job has no checkpoint of its own to resume, ``load`` reads into each tensor
only this rank's part: a sharded ``DTensor``'s local shard (its rows are one byte range of the file, read
straight into the shard's memory), a replicated model's tensors whole. Names are matched as transformers saves
them (a tied weight is saved once under one of its names; a model that is the base model's head may find its
names under or without ``base_model_prefix``). Before anything is read, every parameter must be found with its
shape: a missing or mis-shaped one is a configuration error naming it. A saved tensor the model does not have is
named in a warning; a buffer the checkpoint lacks keeps the value ``build_model`` gave it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import torch
from torch import nn

from entrypoint.errors import ConfigError
from entrypoint.outputs import storage
from entrypoint.outputs.locations import local_path
from entrypoint.outputs.storage import Location, StorageError

log = logging.getLogger("entrypoint.pytorch")
FLAG = "--init-from"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
MAX_HEADER = 100 * 2**20  # safetensors' own limit on the JSON header


@dataclass(frozen=True)
class Saved:
    """One tensor of the checkpoint: its file, dtype, shape and where its bytes are in the file."""

    file: Location
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


# ---- building without memory ---------------------------------------------------------------------
@contextlib.contextmanager
def meta_parameters() -> Iterator[None]:
    """Every parameter registered in the block is moved to the meta device (no memory, no initialization);
    buffers stay where they are made. Tied parameters (one ``Parameter`` under two names) stay tied."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            kwargs = dict(param.__dict__)
            kwargs["requires_grad"] = param.requires_grad
            module._parameters[name] = type(param)(param.to("meta"), **kwargs)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def on_meta(model: nn.Module) -> bool:
    """Whether ``model`` was built by ``meta_parameters`` (its parameters have no memory yet)."""
    return any(p.is_meta for p in model.parameters())


def materialize(model: nn.Module, device: torch.device) -> None:
    """Memory for every parameter on ``device`` (uninitialized until ``load``); buffers keep their values."""
    buffers = {name: b for name, b in model.named_buffers() if not b.is_meta}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name in buffers:
                buffer.copy_(buffers[name])


# ---- the checkpoint ------------------------------------------------------------------------------
def _files(init_from: str) -> tuple[Location, list[Location]]:
    """The checkpoint's root and its safetensors files (one, or those the index names)."""
    root = storage.path(local_path(init_from))
    try:
        if root.is_file():
            return root, [root]
        index = root / INDEX_FILE
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ConfigError(FLAG, f"{index} has no weight_map (not a Hugging Face safetensors index)")
            return root, [root / name for name in sorted(set(weight_map.values()))]
        if (root / SINGLE_FILE).is_file():
            return root, [root / SINGLE_FILE]
        exists = root.exists()
    except (OSError, ValueError) as exc:
        raise ConfigError(FLAG, f"{init_from} cannot be read: {type(exc).__name__}: {exc}") from None
    if not exists:
        raise ConfigError(FLAG, f"{init_from} does not exist")
    raise ConfigError(FLAG, f"{init_from} has neither {SINGLE_FILE} nor {INDEX_FILE} (a Hugging Face checkpoint saved "
                            "with save_pretrained(..., safe_serialization=True))")


def read_header(file: Location, handle: IO[bytes]) -> dict[str, Saved]:
    """The tensors a safetensors file holds (its JSON header: names, dtypes, shapes, byte offsets)."""
    head = handle.read(8)
    size = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
    if not 0 < size <= MAX_HEADER:
        raise ConfigError(FLAG, f"{file} is not a safetensors file")
    header = json.loads(handle.read(size))
    found: dict[str, Saved] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in DTYPES:
            raise ConfigError(FLAG, f"{name} in {file} has dtype {entry['dtype']}, which this loader does not read")
        begin, end = entry["data_offsets"]
        found[name] = Saved(file, DTYPES[entry["dtype"]], tuple(entry["shape"]), 8 + size + begin, 8 + size + end)
    return found


def checkpoint_tensors(init_from: str) -> dict[str, Saved]:
    """Every tensor of the checkpoint at ``init_from``, by name (only the files' headers are read)."""
    _, files = _files(init_from)
    found: dict[str, Saved] = {}
    for file in files:
        try:
            with file.open("rb") as handle:
                found.update(read_header(file, handle))
        except (OSError, ValueError, KeyError, struct.error) as exc:
            raise ConfigError(FLAG, f"{file} cannot be read as safetensors: {type(exc).__name__}: {exc}") from None
    return found


# ---- matching ------------------------------------------------------------------------------------
def _candidates(name: str, prefix: str) -> list[str]:
    """The names a model's tensor may be saved under: its own, then with or without the base model's prefix."""
    if not prefix:
        return [name]
    head = f"{prefix}."
    return [name, name[len(head):]] if name.startswith(head) else [name, f"{head}{name}"]


def match(model: nn.Module, saved: dict[str, Saved]) -> list[tuple[str, Any, Saved]]:
    """(the model's name, its tensor, the saved tensor) for every tensor of the model found in the checkpoint;
    a configuration error naming the first parameter missing or of another shape."""
    entries = model.state_dict(keep_vars=True)
    parameters = {id(p) for p in model.parameters()}
    prefix = str(getattr(model, "base_model_prefix", "") or "")
    names: dict[int, list[str]] = {}
    for name, value in entries.items():
        names.setdefault(id(value), []).append(name)
    plan: list[tuple[str, Any, Saved]] = []
    used: set[str] = set()
    for aliases in names.values():
        value = entries[aliases[0]]
        found = next(((alias, key) for alias in aliases for key in _candidates(alias, prefix) if key in saved), None)
        if found is None:
            if id(value) in parameters:
                raise ConfigError(FLAG, f"has no tensor {aliases[0]} (the model's; a checkpoint of another model?)")
            log.debug("%s: not in the checkpoint, keeps the value build_model gave it", aliases[0])
            continue
        alias, key = found
        entry = saved[key]
        if entry.shape != tuple(value.shape):
            raise ConfigError(FLAG, f"{key} is {list(entry.shape)} in {entry.file} but {list(value.shape)} in the "
                                    "model (a checkpoint of another model?)")
        used.update(k for a in aliases for k in _candidates(a, prefix))
        plan.append((alias, value, entry))
    unexpected = sorted(set(saved) - used)
    if unexpected:
        log.warning("%s: %d saved tensor(s) the model does not have, not loaded: %s", FLAG, len(unexpected),
                    ", ".join(unexpected[:5]) + (", ..." if len(unexpected) > 5 else ""))
    return plan


# ---- reading -------------------------------------------------------------------------------------
def _region(value: Any) -> tuple[torch.Tensor, tuple[int, ...]]:
    """This rank's part of ``value``: its local tensor and where it starts in the global one."""
    if hasattr(value, "to_local") and hasattr(value, "device_mesh"):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        local = value.to_local()
        _shape, offset = compute_local_shape_and_global_offset(value.shape, value.device_mesh, value.placements)
        return local, tuple(int(o) for o in offset)
    return value, (0,) * value.dim()


def _read_into(handle: IO[bytes], entry: Saved, value: Any) -> int:
    """This rank's part of one saved tensor into ``value``; the bytes read."""
    local, offset = _region(value)
    if local.numel() == 0:
        return 0
    shape = entry.shape
    rows = int(local.shape[0]) if shape else 1
    row_bytes = entry.dtype.itemsize * (math.prod(shape[1:]) if shape else 1)
    first = offset[0] if shape else 0
    handle.seek(entry.start + first * row_bytes)
    size = rows * row_bytes
    target = local.detach()
    whole_rows = tuple(local.shape[1:]) == shape[1:]
    with torch.no_grad():
        if whole_rows and target.device.type == "cpu" and target.dtype == entry.dtype and target.is_contiguous():
            view = target.reshape(-1).view(torch.uint8).numpy()  # the shard's own memory: no second copy
            got = handle.readinto(view)  # type: ignore[attr-defined]
            if got != size:
                raise ValueError(f"{entry.file} ends inside a tensor")
            return size
        data = bytearray(handle.read(size))
        if len(data) != size:
            raise ValueError(f"{entry.file} ends inside a tensor")
        block = torch.frombuffer(data, dtype=torch.uint8).view(entry.dtype).reshape((rows, *shape[1:]) if shape else ())
        for dim in range(1, len(shape)):
            block = block.narrow(dim, offset[dim], int(local.shape[dim]))
        target.copy_(block)
    return size


def load(model: nn.Module, init_from: str) -> int:
    """Every tensor of ``model`` found in the checkpoint, this rank's part of each; the bytes this rank read."""
    plan = match(model, checkpoint_tensors(init_from))
    by_file: dict[str, list[tuple[str, Any, Saved]]] = {}
    for item in plan:
        by_file.setdefault(str(item[2].file), []).append(item)
    read = 0
    for items in by_file.values():
        file = items[0][2].file
        try:
            with file.open("rb") as handle:
                for _name, value, entry in sorted(items, key=lambda item: item[2].start):
                    read += _read_into(handle, entry, value)
        except (StorageError, ConfigError):
            raise
        except (OSError, ValueError, RuntimeError) as exc:
            raise ConfigError(FLAG, f"{file} cannot be read: {type(exc).__name__}: {exc}") from None
    return read
