"""Either checkpoint format into either kind of model, the state dicts' side (``formats.py`` reads the files through
the writers and calls these): what lets a model outgrow DDP, and come back.

- A replicated checkpoint (``state.pt``, written by DDP, Horovod or one process) holds the whole model and
  optimizer state. Into a replicated model it loads as it always did; into a sharded one each rank takes its
  shards (``set_model_state_dict`` / ``set_optimizer_state_dict`` from the full state, the optimizer state keyed
  by parameter names: ``optimizer_fqns``, saved beside it, maps the optimizer's positions to names).
- A sharded checkpoint (torch.distributed.checkpoint: ``.metadata``, ``__<rank>_<n>.distcp``, ``extra.pt``)
  loads into a sharded model at any world size (``dcp.load`` reshards), and into a replicated model by reading
  the whole tensors in this process alone (``no_dist``).

Before anything is read, the checkpoint's tensor shapes are compared with the model's: a checkpoint of another
model is refused naming the first tensor that differs, and nothing is overwritten.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from entrypoint.outputs.checkpoints import CheckpointError
from entrypoint.outputs.storage import Location
from entrypoint.pytorch.checkpoints.sharded_io import is_sharded_checkpoint, readable

log = logging.getLogger("entrypoint.pytorch")


def optimizer_fqns(model: nn.Module, optimizer: Any) -> list[list[str]]:
    """The parameter names of each of the optimizer's groups, in its order (how its positions map to names)."""
    names = {id(p): name for name, p in model.named_parameters()}
    return [[names.get(id(p), "") for p in group["params"]] for group in optimizer.param_groups]


def _by_name(saved: dict[str, Any], fqns: list[list[str]]) -> dict[str, Any]:
    """A positional optimizer state dict (``torch.optim``'s) keyed by parameter names instead."""
    mapping = {pid: name for group, names in zip(saved["param_groups"], fqns, strict=True)
               for pid, name in zip(group["params"], names, strict=True)}
    return {"state": {mapping[pid]: value for pid, value in saved["state"].items()},
            "param_groups": [{**group, "params": [mapping[pid] for pid in group["params"]]}
                             for group in saved["param_groups"]]}


def _shapes(state: dict[str, Any], prefix: str = "") -> dict[str, tuple[int, ...]]:
    """Every tensor's global shape, under DCP's flattened names (``model.<fqn>``)."""
    found: dict[str, tuple[int, ...]] = {}
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, torch.Tensor):
            found[name] = tuple(value.shape)
        elif isinstance(value, dict):
            found.update(_shapes(value, f"{name}."))
    return found


def check_shapes(model: nn.Module, path: Location) -> None:
    """Refuse a checkpoint of another model before reading it: the first tensor whose shape differs, or is missing."""
    wanted = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    if is_sharded_checkpoint(path):
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        with readable(path, only=(".metadata",)) as local:
            meta = FileSystemReader(str(local)).read_metadata().state_dict_metadata
        saved = {key.removeprefix("model."): tuple(entry.size) for key, entry in meta.items()
                 if key.startswith("model.") and isinstance(entry, TensorStorageMetadata)}
    else:
        return  # a replicated checkpoint is checked by load_state_dict itself (it names the tensors)
    for name, shape in wanted.items():
        if name not in saved:
            raise CheckpointError(f"it has no tensor {name} (a checkpoint of another model?)")
        if saved[name] != shape:
            raise CheckpointError(f"{name} is {tuple(saved[name])} in the checkpoint but {shape} in the model "
                                  "(a checkpoint of another model?)")


def apply_full(model: nn.Module, optimizer: Any, saved: dict[str, Any], path: Location) -> None:
    """A replicated checkpoint's whole state (``saved``, read by its writer) into a sharded model: each rank takes
    its shards; the optimizer state by parameter names (``optimizer_fqns``, or the model's order if it matches)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    full = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, saved["model"], options=full)
    fqns = saved.get("optimizer_fqns") or _positional_names(model, saved["optimizer"])
    if fqns is None:
        log.warning("%s: the optimizer state could not be matched to parameter names: it starts afresh", path)
    else:
        set_optimizer_state_dict(model, optimizer, _by_name(saved["optimizer"], fqns), options=full)


def _positional_names(model: nn.Module, saved: dict[str, Any]) -> list[list[str]] | None:
    """Names for an older checkpoint without ``optimizer_fqns``: the model's parameters, in order, if they match."""
    names = [name for name, _ in model.named_parameters()]
    sizes = [len(group["params"]) for group in saved["param_groups"]]
    if sum(sizes) != len(names):
        return None
    out, start = [], 0
    for size in sizes:
        out.append(names[start:start + size])
        start += size
    return out


def whole_state(model: nn.Module, optimizer: Any) -> dict[str, Any]:
    """A replicated model's and optimizer's state dicts under a sharded checkpoint's names (what it loads into)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return {"model": model.state_dict(), "optim": get_optimizer_state_dict(model, optimizer)}


def apply_whole(model: nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
    """Put what a sharded checkpoint filled into ``whole_state`` back into the replicated model and optimizer."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    model.load_state_dict(state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])


def sharded_state(model: nn.Module, optimizer: Any) -> dict[str, Any]:
    """The sharded model's and optimizer's state dicts (each rank's shards, keyed by parameter names)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}


def apply_sharded(model: nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
    """Put shards ``dcp.load`` filled back into the sharded model and optimizer."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])
