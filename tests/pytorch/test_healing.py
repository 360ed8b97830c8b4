"""The pieces of HSDP's in-place recovery that need no second process: the node's group kept through the job's
group's destruction, a sharded rank's live state sent as local tensors and adopted bit for bit, and which jobs
keep training in place. The whole recovery, with processes, is ``test_hsdp_survivors.py``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from entrypoint.cluster.environments import resolve
from entrypoint.cluster.environments.settings import PlatformSettings
from entrypoint.options import RunOptions
from entrypoint.planning.plan import make_plan
from tests.unit.test_environments import vertex

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.pytorch


@pytest.fixture
def one_rank() -> Iterator[Any]:
    """A real gloo group of one rank in this process (and its node's group), destroyed after the test."""
    from entrypoint.pytorch.launch.collectives import TorchDistributed

    comm = TorchDistributed("gloo", 0, 1, 30)
    comm.form_group(dist.HashStore())
    try:
        yield comm
    finally:
        comm.drop_group()


def sharded(comm: Any, seed: int) -> Any:
    """A small model sharded over the node's group, its Adam optimizer, in a TrainState."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from entrypoint.pytorch.state import TrainState

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    mesh = DeviceMesh.from_group(comm.by_node(0, 1).form_node(), "cpu", mesh_dim_names=("shard",))
    fully_shard(model, mesh=mesh)
    return TrainState(model, torch.optim.Adam(model.parameters(), 1e-2), None)


def train(state: Any, steps: int) -> None:
    for _ in range(steps):
        state.optimizer.zero_grad()
        state.model(torch.randn(4, 6)).pow(2).mean().backward()
        state.optimizer.step()
        state.advance(4)


def test_the_nodes_group_outlives_the_jobs_group_and_is_registered_again(one_rank: Any) -> None:
    node = one_rank.by_node(0, 1).form_node()
    one_rank.drop_group()  # torch would shut down every registered group here
    with pytest.raises(ValueError):
        dist.get_rank(node)  # out of the registry while no job's group exists
    one_rank.form_group(dist.HashStore())
    assert dist.get_rank(node) == 0 and dist.get_process_group_ranks(node) == [0]
    value = torch.ones(2)
    dist.all_reduce(value, group=node)  # it still works: its connections were never shut down
    assert value.tolist() == [1.0, 1.0]


def test_a_replacement_adopts_its_sources_shards_and_optimizer_state_bit_for_bit(one_rank: Any) -> None:
    from entrypoint.pytorch.recovery.healing import adopt_shards, live_shards, state_digest

    live = sharded(one_rank, seed=1)
    train(live, 3)
    replacement = sharded(one_rank, seed=2)  # other first weights, no optimizer state yet
    assert state_digest(replacement) != state_digest(live)
    sent = live_shards(live, 1)
    assert not any(hasattr(t, "to_local") for t in sent["model"].values())  # local tensors travel, not DTensors
    adopt_shards(replacement, sent)
    assert state_digest(replacement) == state_digest(live)
    assert (replacement.step, replacement.sample) == (3, 12)
    torch.manual_seed(0)
    train(live, 1)  # and it trains on as its source does: the same batch from the same state, the same result
    torch.manual_seed(0)
    train(replacement, 1)
    assert state_digest(replacement) == state_digest(live)


def test_the_digest_sees_the_optimizer_state(one_rank: Any) -> None:
    from entrypoint.pytorch.recovery.healing import state_digest

    state = sharded(one_rank, seed=1)
    train(state, 1)
    before = state_digest(state)
    next(iter(state.optimizer.state.values()))["exp_avg"].to_local()[0] += 1e-7
    assert state_digest(state) != before


def plan(strategy: str, *extra: tuple[str, Any]) -> Any:
    options = RunOptions(framework="pytorch", module="tests.pytorch.sharded_hooks", strategy=strategy,
                         framework_options=tuple(extra))
    return make_plan(resolve(vertex("workerpool1", 0)), options, PlatformSettings(), 0)


@pytest.mark.parametrize(("strategy", "recovery", "expected"), [
    ("ddp", "in-place", True),
    ("hsdp", "in-place", True),  # a live node holds a whole replica
    ("fsdp", "in-place", True),  # a peer's memory holds each rank's shards (--peer-snapshots on, the default)
    ("hsdp", "restart", False),  # the off switch
])
def test_which_jobs_keep_training_in_place(strategy: str, recovery: str, expected: bool) -> None:
    from entrypoint.pytorch.launch.membership import applies

    assert applies(plan(strategy, ("recovery", recovery))) is expected


def test_fsdp_with_peer_snapshots_off_restarts_from_storage() -> None:
    """Without copies in a peer's memory a lost rank takes its shards with it: the job restarts."""
    from entrypoint.pytorch.launch.membership import applies

    assert applies(plan("fsdp", ("recovery", "in-place"), ("peer_snapshots", "off"))) is False
