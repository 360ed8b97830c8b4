"""The export of a transformers ``PreTrainedModel``: a directory ``from_pretrained`` opens, written from the shards.

What ``save_pretrained(..., safe_serialization=True)`` writes, without transformers being imported here (it is the
user's dependency, never the image's): the weights as the hub shards them (``model.safetensors``, or past
``max_shard_size`` bytes ``model-00001-of-0000N.safetensors`` ... with ``model.safetensors.index.json``: the total
size and each tensor's file), ``generation_config.json`` for a model that generates, and ``config.json`` (its
``architectures`` and ``dtype`` set as ``save_pretrained`` sets them), written last: a directory with a config is
whole. A tied weight is written once, under the name transformers keeps (not one of ``_tied_weights_keys``).

Each weights file is streamed as the plain export streams ``model.safetensors`` (``export.write_safetensors``:
every rank takes part, a row-sharded tensor goes to the chief shard by shard), so the model is never gathered
whole on one rank.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch

from entrypoint.outputs.storage import Location, RemotePath
from entrypoint.pytorch.checkpoints.checkpoint_io import output_error
from entrypoint.pytorch.loop.export import SAFETENSORS_FILE, partial, publish, write_safetensors

MAX_SHARD_SIZE = 5 * 10**9  # bytes: save_pretrained's default "5GB"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
GENERATION_FILE = "generation_config.json"


def is_pretrained(model: Any) -> bool:
    """Whether ``model`` is a transformers ``PreTrainedModel`` (also once ``fully_shard`` subclassed it)."""
    return hasattr(model, "config") and any(
        cls.__name__ == "PreTrainedModel" and cls.__module__.startswith("transformers.")
        for cls in type(model).__mro__)


def unique_names(model: torch.nn.Module) -> list[str]:
    """The state dict's names, a tied tensor once: under a name not in ``_tied_weights_keys`` when it has one."""
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    groups: dict[int, list[str]] = {}
    for name, value in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(value), []).append(name)
    keep = {next((n for n in names if n not in tied), names[0]) for names in groups.values()}
    return [name for names in groups.values() for name in names if name in keep]


def hub_files(sizes: list[tuple[str, int]], max_shard_size: int) -> list[list[str]]:
    """The names in each file, in order: a file is closed when the next tensor would take it past
    ``max_shard_size`` (a larger tensor is a file of its own), as ``save_pretrained`` cuts them."""
    files: list[list[str]] = [[]]
    used = 0
    for name, size in sizes:
        if files[-1] and used + size > max_shard_size:
            files.append([])
            used = 0
        files[-1].append(name)
        used += size
    return files


def file_names(count: int) -> list[str]:
    """``model.safetensors`` alone, else ``model-00001-of-0000N.safetensors``..."""
    if count == 1:
        return [SAFETENSORS_FILE]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def _write_text(target: Location, text: str) -> None:
    try:
        if isinstance(target, RemotePath):
            target.write_text(text)
            return
        written = partial(target)
        written.write_text(text)
        publish(written, target)
    except Exception as exc:
        raise output_error(exc, target) from None


def config_json(model: Any) -> str:
    """``config.json``'s text, as ``save_pretrained`` writes it (architecture and dtype set on the config)."""
    config = model.config
    config.architectures = [type(model).__name__.removeprefix("FSDP")]
    first = next(iter(model.parameters()), None)
    if first is not None:
        config.dtype = str(first.dtype).split(".")[1]
    return str(config.to_json_string(use_diff=True))


def generation_json(model: Any) -> str | None:
    """``generation_config.json``'s text for a model that generates, else None."""
    generation = getattr(model, "generation_config", None)
    can_generate = getattr(model, "can_generate", None)
    if generation is None or not callable(can_generate) or not can_generate():
        return None
    return str(generation.to_json_string(use_diff=True))


def export_pretrained(model: torch.nn.Module, model_dir: Location, chief: bool,
                      max_shard_size: int = MAX_SHARD_SIZE) -> list[str]:
    """Write the ``from_pretrained`` directory (every rank calls it for a sharded model); the weights files."""
    state = model.state_dict()
    names = unique_names(model)
    sizes = [(n, state[n].dtype.itemsize * math.prod(state[n].shape)) for n in names]
    groups = hub_files(sizes, max_shard_size)
    files = file_names(len(groups))
    for file, group in zip(files, groups, strict=True):
        write_safetensors({n: state[n] for n in group}, model_dir / file, chief)
    if chief:
        if len(files) > 1:
            index = {"metadata": {"total_size": sum(size for _, size in sizes)},
                     "weight_map": {n: file for file, group in zip(files, groups, strict=True) for n in group}}
            _write_text(model_dir / INDEX_FILE, json.dumps(index, indent=2, sort_keys=True) + "\n")
        generation = generation_json(model)
        if generation is not None:
            _write_text(model_dir / GENERATION_FILE, generation)
        _write_text(model_dir / CONFIG_FILE, config_json(model))
    return files
