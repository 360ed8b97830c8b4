"""FSDP without replicas heals from peer memory (``--strategy fsdp`` across nodes, ``--recovery in-place`` and
``--peer-snapshots on``, the defaults): at each commit, and every ``--snapshot-every`` steps between, every rank
keeps a host copy of its shards and sends one to the same local rank of the other node; the worker node's processes
are SIGKILLed mid-epoch, the chief's node keeps its processes and waits for the replacement, and every rank rolls back
to the newest snapshot every rank's copy of is there, the replacement taking its shards from its peer's memory;
nothing is read from storage, and the job ends with the weights of one resumed from a checkpoint (both are the
uninterrupted run's, bit for bit).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from entrypoint.outputs import checkpoints
from entrypoint.outputs.goodput import IN_PLACE
from tests.pytorch.test_hsdp_survivors import lose_the_worker_node, spoil
from tests.runs import Job, entrypoint, failure_text, summary

torch = pytest.importorskip("torch")  # collected in every venv; these run where torch is
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
EVERY, SNAPSHOT = 4, 2  # --checkpoint-every (a snapshot at each commit) and --snapshot-every (one between)
TRAIN = ["--framework", "pytorch", "--module", "tests.pytorch.sharded_hooks", "--timeout", "120", "--log-every", "1",
         "--strategy", "fsdp", "--epochs", "2", "--checkpoint-every", str(EVERY), "--snapshot-every", str(SNAPSHOT)]
ROLLED = (r"\[workerpool0-0\] .*group re-formed with 4 ranks: every rank rolled back to its snapshot of step (\d+), "
          r"healed rank 2 from rank 0, rank 3 from rank 1 from peer memory in [\d.]+ s, nothing read from storage; "
          r"fingerprints (\S+) (\S+) (\S+) (\S+)")


def test_a_lost_fsdp_node_heals_from_its_peers_memory_and_ends_as_a_run_resumed_from_a_checkpoint(
        tmp_path: Path) -> None:
    """The worker node is SIGKILLed mid-epoch: the chief's node keeps its processes, every rank rolls back to the last
    snapshot (the replacement's shards from the chief's node's memory, fingerprinted), nothing is read from storage
    (every committed shard spoiled before the loss), and the job finishes and exports the weights of the same job
    resumed from the newest checkpoint before that step, bit for bit."""
    out, saved, hold = tmp_path / "job", tmp_path / "saved", tmp_path / "hold"
    job = Job("local", "--workers", "2", "--output-dir", str(out), "--", "run", *TRAIN, "--nproc-per-node", "2",
              "--", "--step-sleep", "0.2", "--hold", str(hold))
    try:
        job.wait_for(f"checkpoint ckpt-{2 * EVERY:08d} committed")
        job.wait_for_step(2 * EVERY + 2)
        shutil.copytree(out / "checkpoints", saved)  # what a resume from storage would read, kept aside
        assert spoil(out / "checkpoints"), "no checkpoint was committed before the loss"
        # the survivors keep their processes and say whom they wait for
        waiting = r"\[workerpool0-0\] .*waiting for workerpool1-0 \(rank 2\), workerpool1-0 \(rank 3\)"
        rolled = lose_the_worker_node(job, hold, waiting, ROLLED)
    finally:
        job.cleanup()
    output = job.output()
    assert "[workerpool0-0#1]" not in output and "[workerpool1-0#1]" in output
    assert re.search(r"\[workerpool1-0#1\] .*joined the group \(generation 1\) at step \d+, healed rank 2 from rank "
                     r"0, rank 3 from rank 1 .* from its peer's memory, nothing read from storage", output)
    assert not re.search(r"resumed from \S*ckpt-", output), output[-4000:]  # no rank read a checkpoint
    step = int(rolled.group(1))
    fingerprints = rolled.groups()[1:]
    assert len(set(fingerprints)) == 4  # four ranks, four shards: each took its own back
    result = summary(out / "model")
    assert result["final_step"] == result["expected_steps"] and result["world_size"] == 4
    (lost,) = result["recoveries"]
    assert lost["how"] == "in_place" and lost["replica"] == "workerpool1-0", lost
    assert lost["resumed_from_step"] == step and step % SNAPSHOT == 0 and step >= 2 * EVERY, lost
    # at most the steps since the last snapshot (and the step in flight) are lost
    assert lost["lost_steps"] == lost["lost_at_step"] - step <= SNAPSHOT + 1, lost
    assert "peer snapshot of step 2: " in output  # the first, between two commits (--snapshot-every)
    # the memory guard ran before it, on every rank, and kept them on: the one host's 4 ranks, their sizes, its memory
    assert re.search(r"\[workerpool0-0\] .*peer snapshots fit in host memory: node \S+ \(workerpool0-0, "
                     r"workerpool1-0\): 4 ranks with [\d.]+ MiB of shards and optimizer state x 5 copies = [\d.]+ MiB, "
                     r"[\d.]+ [GM]iB available \(at most 50% of what it can give\)", output), output[-4000:]
    assert (out / "model" / "model.safetensors").is_file()
    report = json.loads(entrypoint("goodput", str(out), "--json").stdout)
    assert report["disruptions"].get(IN_PLACE) == 1, report["disruptions"]
    assert report["steps"]["lost"] == lost["lost_steps"], report["steps"]  # the ledger counts the rolled-back steps
    # the same job resumed from the newest checkpoint at or before that step (storage's copy, kept aside) ends with
    # the same weights: the heal is as exact as a resume
    kept = max(s for s, _ in checkpoints.committed(saved) if s <= step)
    again = tmp_path / "again"
    (again / "checkpoints").mkdir(parents=True)
    shutil.copytree(saved / f"ckpt-{kept:08d}", again / "checkpoints" / f"ckpt-{kept:08d}")
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(again), "--", "run", *TRAIN,
                      "--nproc-per-node", "2", timeout=600)
    assert proc.returncode == 0, failure_text(proc)
    assert re.search(rf"resumed from \S*ckpt-{kept:08d}", proc.stdout), proc.stdout[-4000:]
    resumed = summary(again / "model")
    assert resumed["final_step"] == result["final_step"]
    assert resumed["param_digests"] == result["param_digests"]  # every rank's shards, bit for bit
    assert (again / "model" / "model.safetensors").read_bytes() == (out / "model" / "model.safetensors").read_bytes()
