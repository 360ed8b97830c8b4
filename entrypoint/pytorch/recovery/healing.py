"""Healing a rank from a live replica, rank to rank: nothing is read from storage.

After the group is formed again (``survivors.py``), every rank that replaces a lost one, and every survivor whose
(step, parameters) differ from its source's, receives its source's live state over the new group. A replica is
``replica_size`` ranks: a replicated model's is one rank (every rank heals from rank 0); HSDP by node's is a node's
processes (rank r heals from rank ``r % replica_size``: the same local rank of the first node, which holds the same
shards of the same layout). What is sent: the parameters (the local shards of a sharded model), the optimizer's state
(its shards), the scheduler, the position in the data (step, epoch, batch, sample), the history and what recoveries
cost; the random streams follow from (seed, rank, step) (``state.reseed``). Then every healed rank's fingerprint (a
digest of its parameters' and optimizer state's bytes) must equal its source's, bit for bit, or the group goes back
to the newest checkpoint.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import torch

from entrypoint.errors import PeerError
from entrypoint.pytorch.checkpoints.resume import adopt, adopt_position, extra, live_state
from entrypoint.pytorch.defaults import param_digest
from entrypoint.pytorch.launch.collectives import TorchDistributed
from entrypoint.pytorch.state import TrainState


@dataclass(frozen=True)
class Healing:
    """Who received a live replica's state (and from whom), the step every rank had reached before, who every rank
    is, and every rank's fingerprint after."""

    healed: list[int]
    steps: list[int]
    members: list[tuple[str, str]]  # (replica, host) per rank
    seconds: float
    sources: dict[int, int]  # healed rank -> the rank it took its state from
    fingerprints: list[str]  # per rank, after healing (``state_digest``)

    def words(self) -> str:
        """``rank 2 from rank 0, rank 3 from rank 1`` (or that nobody needed it)."""
        return ", ".join(f"rank {r} from rank {self.sources[r]}" for r in self.healed) or \
            "nobody (every survivor held its source's state)"


def _local(value: Any) -> Any:
    return value.to_local() if hasattr(value, "to_local") else value


def _copy(value: Any) -> Any:
    """A tensor's local part, copied to host memory (what is sent shares nothing with the training state)."""
    return _local(value).detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else value


def _bytes(tensor: torch.Tensor) -> bytes:
    return bytes(_local(tensor).detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def state_digest(state: TrainState) -> str:
    """A digest of this rank's parameters (its shards) and optimizer state, bytes as they are."""
    return tensors_digest(state.model.state_dict(), state.optimizer.state_dict()["state"])


def tensors_digest(model: dict[str, Any], optimizer_state: dict[Any, Any]) -> str:
    """``state_digest`` of a model's state dict and an optimizer's ``state`` (live, or the host copy
    ``live_shards`` made of them: the same digest)."""
    digest = hashlib.sha256()
    for name, tensor in model.items():
        digest.update(name.encode())
        digest.update(_bytes(tensor))
    for index, entry in sorted(optimizer_state.items()):
        for key, value in sorted(entry.items()):
            digest.update(f"{index}/{key}".encode())
            if isinstance(value, torch.Tensor):
                digest.update(_bytes(value))
            else:
                digest.update(repr(value).encode())
    return digest.hexdigest()[:16]


def live_shards(state: TrainState, world_size: int) -> dict[str, Any]:
    """This rank's live state as local tensors in host memory (a sharded model's shards, their optimizer state)."""
    optimizer = state.optimizer.state_dict()
    dtensors = [[index, key] for index, entry in optimizer["state"].items() for key, value in entry.items()
                if hasattr(value, "to_local")]
    optimizer["state"] = {index: {key: _copy(value) for key, value in entry.items()}
                          for index, entry in optimizer["state"].items()}
    model = {name: _copy(tensor) for name, tensor in state.model.state_dict().items()}
    return {"model": model, "optimizer": optimizer, "dtensors": dtensors, **extra(state, world_size)}


def adopt_shards(state: TrainState, saved: dict[str, Any]) -> None:
    """Make this rank's shards, optimizer state and position those ``live_shards`` of its source sent."""
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        for name, tensor in state.model.state_dict().items():
            _local(tensor).copy_(saved["model"][name])
    params = [p for group in state.optimizer.param_groups for p in group["params"]]
    optimizer = saved["optimizer"]
    for index, key in saved["dtensors"]:  # the optimizer's state of a sharded parameter is sharded like it
        param, value = params[int(index)], optimizer["state"][index][key]
        optimizer["state"][index][key] = DTensor.from_local(value.to(_local(param).device), param.device_mesh,
                                                            param.placements, run_check=False, shape=param.shape,
                                                            stride=param.stride())
    state.optimizer.load_state_dict(optimizer)
    adopt_position(state, saved, 0)


def heal(comm: TorchDistributed, state: TrainState, joining: bool, me: tuple[str, str],
         replica_size: int = 1) -> Healing:
    """Every rank whose (step, parameters) differ from its source's, and every replacement, gets its source's live
    state (rank r's source: rank ``r % replica_size``); then every healed rank's fingerprint is its source's."""
    started = time.perf_counter()
    views = comm.gather_object((state.step, param_digest(state.model), joining, me))
    sources = {r: r % replica_size for r in range(len(views)) if r % replica_size != r}
    healed = [r for r, (step, digest, new, _) in enumerate(views)
              if r in sources and (new or (step, digest) != tuple(views[sources[r]][:2]))]
    sharded = replica_size > 1
    mine = [r for r in healed if sources[r] == comm.rank]
    if mine:
        payload = live_shards(state, comm.world_size) if sharded else live_state(state, comm.world_size)
        for rank in mine:
            comm.send_object(payload, rank)
    elif comm.rank in healed:
        received = comm.recv_object(sources[comm.rank])
        if sharded:
            adopt_shards(state, received)
        else:
            adopt(state, received)
    fingerprints = comm.gather_object(state_digest(state))  # every rank holds its source's state: train again
    differ = [r for r in healed if fingerprints[r] != fingerprints[sources[r]]]
    if differ:
        raise PeerError("healing from the live replica failed: the state of " +
                        ", ".join(f"rank {r} ({fingerprints[r]})" for r in differ) + " differs from its source's (" +
                        ", ".join(f"rank {sources[r]}: {fingerprints[sources[r]]}" for r in differ) +
                        "); back to the newest checkpoint")
    return Healing(healed, [int(v[0]) for v in views], [tuple(v[3]) for v in views], time.perf_counter() - started,
                   {r: sources[r] for r in healed}, [str(f) for f in fingerprints])
