"""Each process's share of every global batch: the data of the job's processes meets in one global array.

Keras shards inputs across processes only as tf.data datasets (its ``auto_shard_dataset``; this image has no
TensorFlow), and refuses anything else across processes. The entrypoint turns that off and does the sharding itself:
every process runs the same script on the same arrays, batches them the same way (every process seeds NumPy alike,
so shuffled orders agree), and keeps its rows of each global batch; ``jax.make_array_from_process_local_data``
(Keras' ``distribute_data_input``) puts the shares back together as the global batch. So ``fit(batch_size=B)``
means what it means on one process, B samples a step, and the weights after N steps are a single process's at
batch B. A last batch that does not split evenly over the data axis's devices loses its remainder (fewer samples
than there are devices). Anything that is no NumPy or JAX array (a ``keras.utils.PyDataset``, a generator) is each
process's own: give each its share (``context.rank()``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import keras
from keras.src.trainers import data_adapters
from keras.src.trainers.data_adapters.data_adapter import DataAdapter

from entrypoint.errors import ConfigError

log = logging.getLogger("entrypoint.jax")
_ORIGINAL = data_adapters.get_data_adapter


def batch_axis_devices() -> int:
    """How many devices the current Keras distribution spreads a batch over (1 without one)."""
    distribution = keras.distribution.distribution()
    if distribution is None:
        return 1
    mesh = distribution.device_mesh
    return int(dict(zip(mesh.axis_names, mesh.shape, strict=True)).get(distribution.batch_dim_name, 1))


class Share:
    """Which rows of a global batch are this process's: ``process`` of ``processes``, the batch split over
    ``devices`` devices of the data axis (a multiple of the process count)."""

    def __init__(self, process: int, processes: int, devices: int) -> None:
        self.process, self.processes, self.devices = process, processes, devices
        self.warned = False

    def rows(self, batch: int, full: int | None = None) -> slice:
        """This process's rows of a batch of ``batch`` samples (``full``: the batch size a full batch has)."""
        if full is not None and full % self.devices:
            raise ConfigError("batch_size", f"{full} does not split evenly over the {self.devices} devices of the "
                              "data axis: use a multiple of it")
        used = batch - batch % self.devices
        if used != batch and not self.warned:
            self.warned = True
            log.warning("a last batch of %d samples leaves %d out: each of the %d devices takes an equal share",
                        batch, batch - used, self.devices)
        each = used // self.processes
        return slice(self.process * each, (self.process + 1) * each)

    def cut(self, batches: Iterator[Any], full: int | None) -> Iterator[Any]:
        """Each batch of ``batches`` cut to this process's rows."""
        for batch in batches:
            first = next(iter(keras.tree.flatten(batch)))
            rows = self.rows(int(first.shape[0]), full)
            yield keras.tree.map_structure(lambda a, rows=rows: a[rows], batch, none_is_leaf=False)


class ProcessShare(DataAdapter):
    """Keras' own adapter of NumPy/JAX arrays, each batch cut to this process's share."""

    def __init__(self, inner: Any, share: Share) -> None:
        self.inner, self.share = inner, share

    def get_numpy_iterator(self) -> Iterator[Any]:
        return self.share.cut(self.inner.get_numpy_iterator(), self.inner.batch_size)

    def get_jax_iterator(self) -> Iterator[Any]:
        return self.share.cut(self.inner.get_jax_iterator(), self.inner.batch_size)

    def get_tf_dataset(self) -> Any:
        raise ConfigError("--framework", "a tf.data dataset of process shares is not supported (no TensorFlow)")

    def get_torch_dataloader(self) -> Any:
        raise ConfigError("--framework", "a torch DataLoader of process shares is not supported")

    @property
    def num_batches(self) -> int | None:
        return self.inner.num_batches

    @property
    def batch_size(self) -> int | None:
        return self.inner.batch_size

    @property
    def has_partial_batch(self) -> bool | None:
        return self.inner.has_partial_batch

    @property
    def partial_batch_size(self) -> int | None:
        return self.inner.partial_batch_size

    def on_epoch_begin(self) -> None:
        self.inner.on_epoch_begin()

    def on_epoch_end(self) -> None:
        self.inner.on_epoch_end()


def share_arrays(process: int, processes: int) -> None:
    """From now on, arrays given to ``fit``/``evaluate``/``predict`` across several processes are cut to this
    process's share of each batch (a no-op for one process)."""
    if processes < 2 or data_adapters.get_data_adapter is not _ORIGINAL:
        return

    def get_data_adapter(*args: Any, **kwargs: Any) -> Any:
        adapter = _ORIGINAL(*args, **kwargs)
        if not isinstance(adapter, data_adapters.ArrayDataAdapter):
            return adapter
        return ProcessShare(adapter, Share(process, processes, max(batch_axis_devices(), processes)))

    data_adapters.get_data_adapter = get_data_adapter
