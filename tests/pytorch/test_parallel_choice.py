"""The pieces of sharded training that need no process group: the strategy rule, shard units, the sampler's
position across world sizes, and the streamed safetensors file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from entrypoint.errors import ConfigError
from entrypoint.planning import registry
from tests.conftest import PYTHON, subprocess_env

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.pytorch

from torch import nn  # noqa: E402

from entrypoint.pytorch.loop import parallel  # noqa: E402
from entrypoint.pytorch.loop.data import EpochSampler  # noqa: E402
from entrypoint.pytorch.loop.export import write_safetensors  # noqa: E402
from trainers.gpt_torch import GPT  # noqa: E402

PYTORCH, HOROVOD = registry.get("pytorch"), registry.get("horovod")
GIB = 2**30


@pytest.mark.parametrize(("parameters", "memory", "nodes", "local", "expected"), [
    (100_000_000, 80 * GIB, 1, 8, "ddp"),  # 1.6 GB of state: fits an 80 GB device
    (3_000_000_000, 80 * GIB, 1, 8, "fsdp"),  # 48 GB > half of 80 GB
    (3_000_000_000, 80 * GIB, 2, 8, "hsdp"),  # but 6 GB per GPU of a node: shard within, replicate across
    (30_000_000_000, 80 * GIB, 2, 8, "fsdp"),  # 60 GB per GPU even within a node: shard over everything
    (3_000_000_000, 80 * GIB, 4, 1, "fsdp"),  # one process per node: nothing to shard within a node
])
def test_the_default_is_ddp_while_the_state_fits_half_a_device(parameters: int, memory: int, nodes: int, local: int,
                                                               expected: str) -> None:
    choice = parallel.choose("ddp", False, parameters, memory, nodes * local, nodes, local, PYTORCH)
    assert choice.name == expected and "GiB" in choice.reason


def test_a_forced_strategy_wins_and_a_single_process_has_nothing_to_shard() -> None:
    forced = parallel.choose("fsdp", True, 10, 80 * GIB, 2, 1, 2, PYTORCH)
    assert forced == parallel.Choice("fsdp", "--strategy fsdp")
    assert parallel.choose("ddp", True, 10**12, GIB, 2, 1, 2, PYTORCH).name == "ddp"
    assert parallel.choose("fsdp", True, 10, GIB, 1, 1, 1, PYTORCH).name == "default"
    assert parallel.choose("horovod", False, 10**12, GIB, 2, 2, 1, HOROVOD).name == "horovod"


@pytest.mark.parametrize(("world", "nodes", "local", "expected"), [
    (4, 2, 2, "hsdp"),  # two nodes of two processes: replicated across, sharded within
    (2, 1, 2, "fsdp"),  # one node: one way to shard
    (2, 2, 1, "fsdp"),  # nodes of one process: nothing to shard within a node
    (6, 2, 2, "fsdp"),  # ranks that are not nodes x processes per node: no 2-D mesh
])
def test_hsdp_that_cannot_be_is_fsdp_in_the_choice_itself(world: int, nodes: int, local: int, expected: str) -> None:
    """The choice is final: the layout built from it shards as it says (the summary's strategy is the mesh's)."""
    choice = parallel.choose("hsdp", True, 10, 80 * GIB, world, nodes, local, PYTORCH)
    assert choice.name == expected
    assert choice.reason == ("--strategy hsdp" if expected == "hsdp" else
                             "--strategy hsdp; HSDP needs several nodes of several processes: FSDP")


def test_the_default_units_are_the_repeated_blocks_and_a_hook_naming_others_is_one_line() -> None:
    model = GPT(vocab=64, block=16, width=32, layers=3, heads=2)
    assert parallel.default_units(model) == list(model.blocks)
    assert parallel.named_units(model, ["blocks.1", model.blocks[2]]) == [model.blocks[1], model.blocks[2]]
    with pytest.raises(ConfigError, match=r"shard_units: names modules that are not in the model: 'decoder', a "
                                          r"Linear that is not part of the model"):
        parallel.named_units(model, ["decoder", nn.Linear(2, 2)])


def epoch_order(size: int, seed: int, epoch: int) -> list[int]:
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(size, generator=g).tolist()


@pytest.mark.parametrize(("before", "after"), [(4, 2), (4, 3), (2, 4), (3, 3)])
def test_an_epoch_resumed_at_another_world_size_sees_every_sample_at_most_once(before: int, after: int) -> None:
    size, seed, offset = 103, 7, 40
    order = epoch_order(size, seed, 1)
    taken = []
    for rank in range(after):
        sampler = EpochSampler(size, rank, after, seed)
        sampler.start(1, offset)
        taken += list(sampler)
    assert len(taken) == len(set(taken)) and not set(taken) & set(order[:offset])
    assert size - offset - len(taken) < after  # only the ragged end is left out


def test_with_the_same_world_the_sampler_is_distributed_samplers_resumed() -> None:
    from torch.utils.data import DistributedSampler

    data = list(range(101))
    for rank in range(3):
        reference = DistributedSampler(data, num_replicas=3, rank=rank, shuffle=True, seed=5, drop_last=True)
        reference.set_epoch(2)
        sampler = EpochSampler(len(data), rank, 3, 5)
        sampler.start(2, 0)
        assert list(sampler) == list(reference)
        sampler.start(2, 3 * 4)
        assert list(sampler) == list(reference)[4:]


def test_the_streamed_safetensors_file_loads_with_the_safetensors_library(tmp_path: Path) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    state = {"a": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.int64), "c": torch.randn(2).bfloat16(),
             "empty": torch.zeros(0, 3), "flag": torch.tensor([True, False])}
    write_safetensors(state, tmp_path / "model.safetensors", writer=True)
    loaded = safetensors_torch.load_file(str(tmp_path / "model.safetensors"))
    assert sorted(loaded) == sorted(state) and all(torch.equal(loaded[k], state[k]) for k in state)


@pytest.mark.parametrize(("threshold", "expected"), [(None, "True"), ("65536", "False")])
def test_sharding_on_cpu_gives_large_buffers_back_unless_the_user_chose_a_threshold(
        threshold: str | None, expected: str) -> None:
    """In a process of its own: the setting changes that process's malloc for good."""
    env = subprocess_env()
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if threshold is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = threshold
    code = "from entrypoint.pytorch.loop.parallel import give_large_buffers_back; print(give_large_buffers_back())"
    out = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [expected]
