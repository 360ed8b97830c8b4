"""HSDP survivors keep training (``--strategy hsdp`` across nodes, ``--recovery in-place``, the default): the worker
node's processes are SIGKILLed mid-epoch, the chief's node keeps its processes and its step, and the node the
platform restarts joins at a step boundary, healed rank to rank from the live replica (local rank i from local rank
i), with nothing read from storage.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from entrypoint.outputs import checkpoints
from entrypoint.outputs.goodput import IN_PLACE
from tests.runs import PROGRESS, Job, entrypoint, replica_group, summary, vanish, wait_gone

torch = pytest.importorskip("torch")  # collected in every venv; these run where torch is
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
RUN = ["run", "--framework", "pytorch", "--module", "tests.pytorch.sharded_hooks", "--timeout", "120",
       "--log-every", "1", "--nproc-per-node", "2", "--strategy", "hsdp", "--epochs", "2", "--checkpoint-every", "4"]
HEALED = (r"\[workerpool0-0\] .*group re-formed with 4 replicas at step (\d+), healed rank 2 from rank 0, rank 3 from "
          r"rank 1 in [\d.]+ s; fingerprints (\S+) (\S+) (\S+) (\S+)")


def spoil(checkpoint_dir: Path) -> list[Path]:
    """Overwrite the shards of every committed checkpoint: a rank that read one would fail to verify or load it."""
    spoiled = []
    for _, path in checkpoints.committed(checkpoint_dir):
        for shard in path.glob("*.distcp"):
            shard.write_bytes(b"\0" * shard.stat().st_size)
            spoiled.append(shard)
    return spoiled


def chief_steps(output: str) -> list[int]:
    """The steps of the chief's progress lines, in the order it logged them."""
    return [int(m.group(1)) for line in output.splitlines() if line.startswith("[workerpool0-0]")
            and (m := PROGRESS.search(line))]


def test_a_lost_hsdp_node_is_healed_from_the_live_replica_and_the_survivors_never_go_back(tmp_path: Path) -> None:
    out = tmp_path / "job"
    job = Job("local", "--workers", "2", "--output-dir", str(out), "--", *RUN, "--", "--step-sleep", "0.2")
    try:
        job.wait_for("checkpoint ckpt-00000004 committed")
        job.wait_for_step(9)
        survivor = replica_group(job, "workerpool0-0")
        committed = max(step for step, _ in checkpoints.committed(out / "checkpoints"))
        assert spoil(out / "checkpoints"), "no checkpoint was committed before the loss"
        vanish(job, "workerpool1-0")
        healed = job.wait_for(HEALED, timeout=240)
        assert replica_group(job, "workerpool0-0") == survivor  # the chief's node kept its processes
        assert job.wait(300) == 0, job.output()[-4000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    output = job.output()
    # local rank i of the returning node holds, bit for bit, what local rank i of the live node holds
    fingerprints = healed.groups()[1:]
    assert fingerprints[2] == fingerprints[0] and fingerprints[3] == fingerprints[1], fingerprints
    assert fingerprints[0] != fingerprints[1]  # two shards of one replica
    assert "[workerpool0-0#1]" not in output and "[workerpool1-0#1]" in output
    assert re.search(r"\[workerpool1-0#1\] .*joined the group \(generation 1\) at step \d+, healed rank 2 from rank "
                     r"0, rank 3 from rank 1 .* nothing read from storage", output), output[-4000:]
    # nothing was read from storage (every shard committed before the loss was spoiled): no rank resumed from one
    assert not re.search(r"resumed from \S*ckpt-", output), output[-4000:]
    steps = chief_steps(output)
    assert steps == sorted(set(steps)), "the survivors' step went back"
    result = summary(out / "model")
    assert result["final_step"] == result["expected_steps"] and result["world_size"] == 4
    digests = result["param_digests"]
    assert digests[0] == digests[2] and digests[1] == digests[3], digests  # the two replicas ended in sync
    (lost,) = result["recoveries"]
    assert lost["how"] == "in_place" and lost["replica"] == "workerpool1-0", lost
    assert lost["lost_steps"] <= 1 and lost["resumed_from_step"] >= 9 and lost["resumed_from_step"] == \
        int(healed.group(1))
    assert lost["resumed_from_step"] >= committed  # 0 committed steps lost: the job went on past its newest commit
    assert (out / "model" / "model.safetensors").is_file()
    report = json.loads(entrypoint("goodput", str(out), "--json").stdout)
    assert report["disruptions"].get(IN_PLACE) == 1, report["disruptions"]
    assert report["steps"]["lost"] <= 1, report["steps"]


def test_a_lost_chief_under_hsdp_restarts_every_node_from_the_newest_sharded_checkpoint(tmp_path: Path) -> None:
    """The chief hosts the job's store: its loss is the checkpoint path, and the checkpoints of HSDP by node (each
    node's shards of one replica) load into the restarted job's replicas."""
    out = tmp_path / "job"
    job = Job("local", "--workers", "2", "--output-dir", str(out), "--", *RUN, "--", "--step-sleep", "0.2")
    try:
        job.wait_for("checkpoint ckpt-00000004 committed")
        job.wait_for_step(6)
        vanish(job, "workerpool0-0")
        assert job.wait(300) == 0, job.output()[-4000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    output = job.output()
    assert re.search(r"\[workerpool0-0#1\] .*resumed from \S*ckpt-\d+ at step ([4-9]|\d\d)", output), output[-4000:]
    result = summary(out / "model")
    assert result["final_step"] == result["expected_steps"]
    digests = result["param_digests"]
    assert digests[0] == digests[2] and digests[1] == digests[3], digests
    assert (out / "model" / "model.safetensors").is_file()
