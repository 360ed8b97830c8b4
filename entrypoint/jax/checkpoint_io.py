"""Orbax checkpoints behind the same typed interface as the other loops' writers (``checkpoints.CheckpointWriter``).

The state is the model's variables (trainable, non-trainable: Keras' seed generators' states too) and the
optimizer's (its step, its moments), as host arrays. ``save`` runs on every process at the same step (the loop's
vote makes it so): each copies the state to host memory (gathered across processes, a collective, only where a
variable is sharded over several: a model-parallel layout), and the chief writes it with Orbax
(``<ckpt-N>/state``, a PyTree checkpoint any Orbax user restores) and commits our marker last, then prunes. Orbax
runs on the chief alone (``active_processes``): nothing waits for the other processes, which write nothing, so a
worker whose disk is its own (a container) never needs to see the chief's files. With ``staging`` (gs:// without
the FUSE mount) the chief writes and commits locally, then uploads, marker last. Synchronous: the blocked and written
seconds are equal. ``load`` is the chief's: the loop hands what it loaded to the other processes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from entrypoint.outputs.checkpoints import CheckpointWriter, Retention, check_sizes, commit, read_marker, write_beside
from entrypoint.outputs.staging import Staging
from entrypoint.outputs.storage import Location

STATE = "state"  # the Orbax checkpoint inside a committed checkpoint directory


def host_copy(value: Any) -> np.ndarray:
    """A variable's value as a host array: local when this process holds all of it (or a whole replica of it),
    else gathered from every process (a collective: every process copies the same variables in the same order)."""
    if getattr(value, "is_fully_addressable", True):
        return np.asarray(value)
    if value.is_fully_replicated:
        return np.asarray(value.addressable_data(0))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(value, tiled=True))


def model_state(model: Any) -> dict[str, list[np.ndarray]]:
    """The training state of a compiled Keras model, as host arrays."""
    return {"trainable": [host_copy(v.value) for v in model.trainable_variables],
            "non_trainable": [host_copy(v.value) for v in model.non_trainable_variables],
            "optimizer": [host_copy(v.value) for v in model.optimizer.variables]}


def assign_state(model: Any, state: dict[str, list[Any]]) -> None:
    """Put a state (host arrays, in ``model_state``'s order) into the model's variables (their layouts kept)."""
    groups = {"trainable": model.trainable_variables, "non_trainable": model.non_trainable_variables,
              "optimizer": model.optimizer.variables}
    for name, variables in groups.items():
        values = state[name]
        if len(values) != len(variables):
            raise ValueError(f"the checkpoint's {name} variables are {len(values)}, the model has {len(variables)}")
        for variable, value in zip(variables, values, strict=True):
            if tuple(np.shape(value)) != tuple(variable.shape):
                raise ValueError(f"{variable.path}: the checkpoint's shape {np.shape(value)}, the model's "
                                 f"{tuple(variable.shape)}")
            variable.assign(value)


def _checkpointer() -> Any:
    import orbax.checkpoint as ocp

    chief_only = ocp.options.MultiprocessingOptions(primary_host=0, active_processes={0},
                                                    barrier_sync_key_prefix="entrypoint-chief")
    return ocp.Checkpointer(ocp.PyTreeCheckpointHandler(multiprocessing_options=chief_only),
                            multiprocessing_options=chief_only)


class JaxCheckpointIO:
    """Save a Keras model's state on JAX as a committed checkpoint (Orbax inside); load one on the chief.

    ``local_dir`` is where the chief writes (the staging directory when staged, else the checkpoint directory);
    ``save`` and ``load`` take the checkpoint's final place (``path``)."""

    def __init__(self, local_dir: Path, is_chief: bool, retention: Retention, staging: Staging | None = None) -> None:
        self.local_dir, self.is_chief, self.retention, self.staging = local_dir, is_chief, retention, staging
        self.blocked_seconds = 0.0
        self.write_seconds = 0.0

    def save(self, path: Location, state: Any, meta: dict[str, Any]) -> None:
        """Every process copies the model ``state`` to the host; the chief writes and commits ``path`` (uploads it
        when staged, marker last) and prunes."""
        started = time.monotonic()
        arrays = model_state(state)
        if self.is_chief:
            local = self.local_dir / path.name

            def write(partial: Path) -> None:
                _checkpointer().save(partial / STATE, arrays)
                commit(partial, meta)
                check_sizes(partial)

            # Written whole beside it first: a checkpoint of this step already committed (a notice's, the epoch's
            # end then saving the same step with its new position) stays until the new one is, never mixed with it
            write_beside(local, write)
            final: Location = self.staging.push_checkpoint(local) if self.staging is not None else local
            self.retention.verified(final)
            self.retention.prune(final.parent)
        elapsed = time.monotonic() - started
        self.blocked_seconds += elapsed
        self.write_seconds += elapsed

    def wait(self) -> None:
        """Nothing is ever in flight."""

    def check(self) -> None:
        """Nothing can have failed in the background."""

    def load(self, path: Location, into: dict[str, Any]) -> int:
        """Read the committed checkpoint at ``path`` (from a downloaded copy when it is on a store) into ``into``
        (``state``: the host arrays, ``marker``: its marker); the epochs it had done."""
        local = self.staging.pull_checkpoint(path) if self.staging is not None else Path(str(path))
        restored = _checkpointer().restore(local / STATE)
        into["state"] = {name: [np.asarray(v) for v in restored[name]] for name in ("trainable", "non_trainable",
                                                                                      "optimizer")}
        into["marker"] = read_marker(path)
        return int(into["marker"].get("epoch", 0))


_CONFORMS: type[CheckpointWriter] = JaxCheckpointIO  # mypy checks that it implements the interface
