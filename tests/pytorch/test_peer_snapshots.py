"""The pieces of FSDP's heal from peer memory that need no second process: a rank rolls back to its own snapshot bit
for bit, a copy that does not match its fingerprint and a snapshot held by no live rank each fall back to storage in
one line, and an FSDP model follows the job's group when the survivors re-form it. The whole recovery, with
processes, is ``test_fsdp_peer_snapshots.py``."""

from __future__ import annotations

import logging
import re
import time
from types import SimpleNamespace
from typing import Any

import pytest

from entrypoint.errors import PeerError
from tests.pytorch.test_healing import one_rank, train

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.pytorch
__all__ = ["one_rank"]  # the fixture, used by name


def world_sharded(seed: int) -> tuple[Any, Any]:
    """A small model sharded by FSDP2 over the job's (default) group, in a TrainState with Adam; and its mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from entrypoint.pytorch.state import TrainState

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("shard",))
    fully_shard(model, mesh=mesh)
    return TrainState(model, torch.optim.Adam(model.parameters(), 1e-2), None), mesh


def keep_own(snapshots: Any, state: Any) -> None:
    """What ``take`` keeps of this rank at a commit (its exchange needs a peer on another node)."""
    from entrypoint.pytorch.recovery.healing import live_shards, tensors_digest

    payload = live_shards(state, 1)
    digest = tensors_digest(payload["model"], payload["optimizer"]["state"])
    snapshots._keep(snapshots.own, state.step, {"payload": payload, "digest": digest, "at": time.time()})


def test_a_survivor_rolls_back_to_its_own_snapshot_bit_for_bit_and_keeps_its_record(one_rank: Any) -> None:
    from entrypoint.pytorch.recovery.healing import state_digest, tensors_digest
    from entrypoint.pytorch.recovery.snapshots import PeerSnapshots

    state, _ = world_sharded(1)
    snapshots = PeerSnapshots(one_rank, 1, 30)
    train(state, 2)
    keep_own(snapshots, state)
    at_snapshot = state_digest(state)
    train(state, 3)  # trained on past the snapshot, then the loss
    state.recoveries = [{"replica": "workerpool1-0"}]
    done = snapshots.heal(state, False, ("workerpool0-0", "host"))
    assert (state.step, state.sample) == (2, 8) and state_digest(state) == at_snapshot
    assert done.fingerprints == [at_snapshot] and done.steps == [5] and done.healed == []
    assert state.recoveries == [{"replica": "workerpool1-0"}]  # the survivors' record, not the snapshot's
    train(state, 1)  # trains on: what it kept is a copy, never the live state
    kept = snapshots.own[2]["payload"]
    assert tensors_digest(kept["model"], kept["optimizer"]["state"]) == at_snapshot


def test_a_snapshot_that_does_not_match_its_fingerprint_falls_back_to_storage_in_one_line(one_rank: Any) -> None:
    from entrypoint.pytorch.recovery.snapshots import PeerSnapshots

    state, _ = world_sharded(1)
    snapshots = PeerSnapshots(one_rank, 1, 30)
    train(state, 2)
    keep_own(snapshots, state)
    next(iter(snapshots.own[2]["payload"]["model"].values())).view(-1)[0] += 1e-6  # a bit flipped in host memory
    with pytest.raises(PeerError, match=r"^the peer-memory snapshot of step 2 does not match its fingerprint on "
                                        r"rank 0 \(\w+, taken as \w+\); the job restarts from its newest checkpoint "
                                        r"in storage$"):
        snapshots.heal(state, False, ("workerpool0-0", "host"))


def test_no_snapshot_before_the_first_commit_falls_back_to_storage(one_rank: Any) -> None:
    from entrypoint.pytorch.recovery.snapshots import PeerSnapshots

    state, _ = world_sharded(1)
    with pytest.raises(PeerError, match=r"no peer-memory snapshot of one step is held for every rank \(rank 0's: "
                                        r"none; none is taken before the first commit\); the job restarts from"):
        PeerSnapshots(one_rank, 1, 30).heal(state, False, ("workerpool0-0", "host"))


class Views:
    """A group of ``world`` ranks as one rank sees it at the heal's first gather (what every rank holds)."""

    def __init__(self, views: list[Any]) -> None:
        self.views, self.rank, self.world_size = views, 0, len(views)

    def gather_object(self, value: Any) -> list[Any]:
        return self.views


def test_a_node_lost_with_its_peer_falls_back_to_storage_naming_both() -> None:
    from entrypoint.pytorch.recovery.snapshots import PeerSnapshots

    me = ("w", "h")
    # 3 nodes of 2 processes: nodes 1 and 2 lost together; node 2's copies were on node 0, node 1's on node 2
    views = [(9, False, me, [8], [8], ""), (9, False, me, [8], [8], ""), (0, True, me, [], [], ""),
             (0, True, me, [], [], ""), (0, True, me, [], [], ""), (0, True, me, [], [], "")]
    with pytest.raises(PeerError, match=r"^the peer-memory snapshots of rank 2 are gone: it and its peer \(rank 4\) "
                                        r"were both lost; the job restarts from its newest checkpoint in storage$"):
        PeerSnapshots(Views(views), 2, 30).heal(SimpleNamespace(step=9), False, me)  # type: ignore[arg-type]
    # one node lost before its first exchange completed: the survivors hold their own copies, none of its
    views = [(5, False, me, [4], [], ""), (5, False, me, [4], [], ""), (0, True, me, [], [], ""),
             (0, True, me, [], [], "")]
    with pytest.raises(PeerError, match=r"^no peer-memory snapshot of one step is held for every rank \(rank 2's: "
                                        r"none; "):
        PeerSnapshots(Views(views), 2, 30).heal(SimpleNamespace(step=9), False, me)  # type: ignore[arg-type]


def test_an_fsdp_model_follows_the_jobs_group_when_the_survivors_re_form_it(one_rank: Any) -> None:
    from entrypoint.pytorch.loop.parallel import regroup

    state, mesh = world_sharded(1)
    train(state, 1)
    one_rank.drop_group()  # a lost peer: the group FSDP captured is destroyed
    one_rank.form_group(dist.HashStore())  # the next generation
    regroup(state.model, mesh)
    group = dist.distributed_c10d._get_default_group()
    assert mesh.get_group() is group  # what a clip of the gradients' norm reduces on
    captured = state.model._get_fsdp_state()._fsdp_param_group  # what FSDP captured at fully_shard
    assert captured._all_gather_process_group is group and captured._reduce_scatter_process_group is group
    train(state, 1)  # gathers and reduces on the new group
    assert state.step == 2


def test_a_snapshots_size_is_counted_without_a_copy(one_rank: Any) -> None:
    from entrypoint.pytorch.recovery.healing import live_shards
    from entrypoint.pytorch.recovery.snapshots import state_bytes

    state, _ = world_sharded(1)
    assert state_bytes(state) == 4 * (6 * 8 + 8 + 8 * 3 + 3)  # before the first step: the parameters, no Adam state
    train(state, 1)
    payload = live_shards(state, 1)
    tensors = list(payload["model"].values()) + [v for e in payload["optimizer"]["state"].values() for v in e.values()
                                                  if v.dim()]  # Adam's step counters are scalars, counted too
    copied = sum(t.numel() * t.element_size() for t in tensors)
    steps = sum(v.numel() * v.element_size() for e in payload["optimizer"]["state"].values() for v in e.values()
                if not v.dim())
    assert state_bytes(state) == copied + steps == 3 * 4 * (6 * 8 + 8 + 8 * 3 + 3) + steps


GIB = 1 << 30
NOTHING = SimpleNamespace(model=SimpleNamespace(state_dict=dict), optimizer=SimpleNamespace(state={}), step=4)


def test_the_memory_guard_turns_the_snapshots_off_for_the_job_where_a_node_cannot_hold_them(
        caplog: pytest.LogCaptureFixture) -> None:
    """Every rank's view of the guard's all-gather (made-up sizes): node b's two ranks of 10 GiB each take 5 copies,
    100 GiB, more than half of the 150 GiB it can give; no snapshot is taken, the chief says so in one line, and a
    loss falls back to storage naming why."""
    from entrypoint.pytorch.recovery.snapshots import PeerSnapshots

    views = [("workerpool0-0", "a", 10 * GIB, 400 * GIB)] * 2 + [("workerpool1-0", "b", 10 * GIB, 150 * GIB)] * 2
    snapshots = PeerSnapshots(Views(views), 2, 30, ("workerpool0-0", "a"))  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, "entrypoint.pytorch"):
        snapshots.take(NOTHING)  # type: ignore[arg-type]
        snapshots.take(NOTHING)  # type: ignore[arg-type]
    said = [r.getMessage() for r in caplog.records if "peer snapshots" in r.getMessage()]
    assert said == ["peer snapshots are off for this job: node b (workerpool1-0): 2 ranks with 20.0 GiB of shards and "
                    "optimizer state x 5 copies = 100.0 GiB, 150.0 GiB available, more than 50% of it; a lost node "
                    "restarts the job from its newest checkpoint in storage (--peer-snapshots off to silence this)"]
    assert [r.levelname for r in caplog.records if "peer snapshots" in r.getMessage()] == ["WARNING"]
    assert snapshots.own == {} and snapshots.thread is None and snapshots.group is None  # nothing taken, no group
    heal = [(9, False, ("w", "h"), [], [], snapshots.off)] * 2 + [(0, True, ("w", "h"), [], [], "")] * 2
    with pytest.raises(PeerError, match=r"^no peer-memory snapshots to heal from \(peer snapshots are off for this "
                                        r"job: node b .*, more than 50% of it\); the job restarts from its newest "
                                        r"checkpoint in storage$"):
        PeerSnapshots(Views(heal), 2, 30).heal(SimpleNamespace(step=9), False, ("w", "h"))  # type: ignore[arg-type]


def test_the_memory_guard_keeps_the_snapshots_on_where_every_node_holds_them(
        caplog: pytest.LogCaptureFixture) -> None:
    from entrypoint.pytorch.recovery.snapshots import PeerSnapshots

    views = [("workerpool0-0", "a", 10 * GIB, 400 * GIB)] * 2 + [("workerpool1-0", "b", 10 * GIB, 200 * GIB)] * 2
    snapshots = PeerSnapshots(Views(views), 2, 30)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, "entrypoint.pytorch"):
        assert snapshots.fits(NOTHING)  # type: ignore[arg-type]
    assert not snapshots.off and snapshots.guarded
    (said,) = [r.getMessage() for r in caplog.records if "peer snapshots" in r.getMessage()]
    assert re.fullmatch(r"peer snapshots fit in host memory: node b \(workerpool1-0\): 2 ranks with 20.0 GiB .* = "
                        r"100.0 GiB, 200.0 GiB available \(at most 50% of what it can give\)", said), said


def test_an_exchange_starting_drops_the_oldest_copy_of_each_kind_and_keeps_the_newest() -> None:
    """At rest each rank holds its own two newest and its peer's two newest (a loss may cut one rank's exchange short
    and not its neighbour's: both roll back to the one before); as the next exchange starts, the oldest of each kind
    is of no use: the peak is 5 copies, not 7."""
    from entrypoint.pytorch.recovery.snapshots import PeerSnapshots

    snapshots = PeerSnapshots(Views([]), 2, 30)  # type: ignore[arg-type]
    for step in (2, 4):
        snapshots._keep(snapshots.own, step, {"step": step})
        snapshots._keep(snapshots.held, step, {"step": step})
    assert sorted(snapshots.own) == sorted(snapshots.held) == [2, 4]
    snapshots._starting(6, {"step": 6})
    assert sorted(snapshots.own) == [4, 6] and sorted(snapshots.held) == [4]
    snapshots._keep(snapshots.held, 6, {"step": 6})  # the peer's copy of step 6 arrived
    assert sorted(snapshots.held) == [4, 6]


def test_a_loss_with_the_snapshots_off_falls_back_to_storage_at_once_not_after_the_replacement() -> None:
    """The memory guard turned them off (every rank agreed): a lost peer ends the survivors' attempt at once (the job
    restarts from storage), never a wait for the replacement with nothing to heal it from."""
    from entrypoint.pytorch.recovery.survivors import InPlace

    off = "peer snapshots are off for this job: node b (workerpool1-0): 2 ranks ...; a lost node restarts the job"
    abandoned: list[bool] = []  # the store told: a node restarted now meets the chief's next store
    survivors = SimpleNamespace(snapshots=SimpleNamespace(off=off), comm=None,  # touched: fails
                                membership=SimpleNamespace(abandon=lambda: abandoned.append(True)))
    with pytest.raises(PeerError, match=r"^lost a peer at step 7 and there are no peer-memory snapshots to heal from "
                                        r"\(peer snapshots are off for this job: node b \(workerpool1-0\): 2 ranks "
                                        r"\.\.\.\); the job restarts from its newest checkpoint in storage$"):
        InPlace.recover(survivors, SimpleNamespace(step=7), 0.0, [])  # type: ignore[arg-type]
    assert abandoned == [True]


def slow_copies(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Each tensor's host copy takes ``seconds`` more: the next step's update comes while the copy runs."""
    from entrypoint.pytorch.recovery.host_copy import HostCopy

    each = HostCopy._copy_each

    def slowly(self: Any, one: Any) -> Any:
        return each(self, lambda t: (time.sleep(seconds), one(t))[1])

    monkeypatch.setattr(HostCopy, "_copy_each", slowly)


def two_nodes(comm: Any) -> Any:
    """This one-rank group seen as rank 0 of 2 nodes (the snapshot's exchange with rank 1 then fails: its copy, its
    fingerprint and the step's wait are what is looked at)."""
    from entrypoint.pytorch.recovery.snapshots import PeerSnapshots

    snapshots = PeerSnapshots(SimpleNamespace(world_size=2, rank=0), 1, 30)  # type: ignore[arg-type]
    snapshots.guarded = True  # the memory guard's all-gather needs the second node
    return snapshots


def test_the_copy_runs_beside_the_next_step_and_its_update_waits_so_the_fingerprint_is_the_steps_end(
        one_rank: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot's host copy is made in the background while the next step's forward and backward run; that
    step's optimizer update (which changes the shards and Adam's moments in place) lands only once the copy is made:
    the copy, and the fingerprint made of it, are of the state the step ended with, not a mix; what the step waited
    is recorded (the snapshot's remaining cost)."""
    from entrypoint.pytorch.recovery.healing import state_digest, tensors_digest

    state, _ = world_sharded(1)
    train(state, 2)
    at_commit = state_digest(state)
    slow_copies(monkeypatch, 0.05)  # 16 tensors: 0.8 s, many times a step of this model
    snapshots = two_nodes(one_rank)
    started = time.perf_counter()
    copying = snapshots.take(state)
    assert copying is not None and time.perf_counter() - started < 0.4  # the take itself does not copy
    train(state, 1)  # forward and backward beside the copy; the update waits for it
    assert state_digest(state) != at_commit and state.step == 3
    snapshots.settle()
    assert snapshots.failed.startswith("the exchange of step 2's snapshot with ranks 1 and 1 failed")
    kept = snapshots.own[2]
    assert kept["digest"] == at_commit  # fingerprinted as the step ended
    assert tensors_digest(kept["payload"]["model"], kept["payload"]["optimizer"]["state"]) == at_commit
    assert (kept["payload"]["step"], kept["payload"]["sample"]) == (2, 8)
    (waited,) = snapshots.waits
    assert 0.2 < waited < copying.seconds + 0.1, (waited, copying.seconds)
    assert snapshots.summary().startswith("peer snapshots: 1 host copies made beside the training steps; the steps "
                                          f"waited {waited:.3f} s for them in all")
    snapshots._hook.remove()


def test_a_heal_after_a_snapshot_waits_for_its_copy_before_it_changes_the_state(
        one_rank: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A returning node taken in right after a commit: the heal adopts a snapshot into the live state, so the copy in
    flight is made first (else it would copy the state the heal wrote)."""
    from entrypoint.pytorch.recovery.healing import state_digest
    from entrypoint.pytorch.recovery.survivors import InPlace

    state, _ = world_sharded(1)
    train(state, 2)
    at_commit = state_digest(state)
    slow_copies(monkeypatch, 0.05)
    snapshots = two_nodes(one_rank)
    survivors = SimpleNamespace(snapshots=snapshots, me=("w", "h"))
    snapshots.take(state)
    healed_after_the_copy: list[bool] = []
    monkeypatch.setattr(snapshots, "heal", lambda *_: healed_after_the_copy.append(snapshots.copying.complete.is_set()))
    InPlace._heal(survivors, state, False)  # type: ignore[arg-type]
    assert healed_after_the_copy == [True]
    snapshots.settle()
    assert snapshots.own[2]["digest"] == at_commit
    snapshots._hook.remove()


def test_a_commits_checkpoint_is_written_from_the_snapshots_copy_not_a_second_one(
        one_rank: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """One host copy at a commit: the sharded checkpoint's shards are the snapshot's copy (the stager copies nothing),
    filled in the writer's thread once the copy is made; the next step's update lands after it, and the checkpoint
    loads back as the state the step ended with."""
    from entrypoint.outputs import checkpoints
    from entrypoint.pytorch.checkpoints import restore
    from entrypoint.pytorch.checkpoints.sharded_io import ShardedCheckpointIO
    from entrypoint.pytorch.recovery.healing import state_digest

    state, _ = world_sharded(1)
    train(state, 2)
    at_commit = state_digest(state)
    slow_copies(monkeypatch, 0.05)
    snapshots = two_nodes(one_rank)
    writer = ShardedCheckpointIO(2, 0, "async", 60, False)
    monkeypatch.setattr(writer.stager, "stage", lambda *_: pytest.fail("the stager copied the shards again"))
    path = checkpoints.checkpoint_path(tmp_path, 2)
    meta = {"step": 2, "epoch": 0, "batch": 2, "sample": 8, "framework": "pytorch", "world_size": 1, "sharded": True}
    host = snapshots.take(state)
    writer.save(path, {"shards": restore.sharded_state(state.model, state.optimizer), "extra": {}, "host": host}, meta)
    assert writer.blocked_seconds < 0.4  # the training thread did not wait for a copy
    train(state, 1)
    writer.wait()
    writer.check()
    snapshots.settle()
    assert checkpoints.is_committed(path)
    again, _ = world_sharded(2)
    train(again, 1)  # Adam's state exists, to be overwritten
    shards = writer.load(path, {"shards": restore.sharded_state(again.model, again.optimizer)})["shards"]
    restore.apply_sharded(again.model, again.optimizer, shards)
    assert state_digest(again) == at_commit
    writer.close()
    snapshots._hook.remove()


def test_the_models_buffers_are_copied_at_the_snapshot_as_a_forward_changes_them() -> None:
    """A forward changes a batch norm's running statistics in place (the parameters and the optimizer's state only
    change in the optimizer's step): those are copied at the snapshot itself, the rest beside the next step."""
    from entrypoint.pytorch.recovery.host_copy import HostCopy, references
    from entrypoint.pytorch.state import TrainState

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    state = TrainState(model, torch.optim.Adam(model.parameters()), None)
    at_snapshot = {name: value.clone() for name, value in model.state_dict().items()}
    copying = HostCopy(*references(state, 1), 0)
    model(torch.randn(8, 3))  # the next step's forward, before the copy is made
    assert not torch.equal(model[1].running_mean, at_snapshot["1.running_mean"])
    payload = copying.run()
    assert all(torch.equal(payload["model"][name], value) for name, value in at_snapshot.items())
