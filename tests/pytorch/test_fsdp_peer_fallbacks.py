"""FSDP's heal from peer memory where it cannot heal, in live jobs under ``local --restart-policy vertex`` (nodes
SIGKILLed whole, as the platform does): storage is the fallback, said in one line on the chief, and the job resumes
from its newest checkpoint; and a replacement holds its predecessor's copy again right after a heal, so a second loss
before the next snapshot heals from memory too. The heal itself is ``test_fsdp_peer_snapshots.py``; the pieces, in one
process, ``test_peer_snapshots.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import time
from pathlib import Path

import pytest

from entrypoint.outputs import checkpoints
from tests.runs import Job, entrypoint, failure_text, summary, vanish, wait_gone

torch = pytest.importorskip("torch")  # collected in every venv; these run where torch is
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
TRAIN = ["--framework", "pytorch", "--module", "tests.pytorch.sharded_hooks", "--timeout", "120", "--log-every", "1",
         "--strategy", "fsdp", "--checkpoint-every", "4", "--snapshot-every", "2"]
FALLBACK = "the job restarts from its newest checkpoint in storage"


def after(job: Job, seen: int, pattern: str, timeout: float = 240) -> re.Match[str]:
    """The first line from the ``seen``-th on matching ``pattern`` (waiting for it)."""
    regex, deadline = re.compile(pattern), time.monotonic() + timeout
    while time.monotonic() < deadline:
        ended = job.proc.poll() is not None and not job._reader.is_alive()  # every line it printed is read
        read = len(job.lines)
        for line in job.lines[seen:read]:
            if match := regex.search(line):
                return match
        if ended:
            break
        seen = read
        time.sleep(0.05)
    raise AssertionError(f"no line matching {pattern!r}:\n{job.output()[-4000:]}")


def newest(checkpoint_dir: Path) -> int:
    return max(step for step, _ in checkpoints.committed(checkpoint_dir))


def resumed_from(output: str, replica: str) -> list[int]:
    """The checkpoint steps a replica's attempts resumed from, in order (its ranks' lines said once)."""
    return list(dict.fromkeys(int(m.group(1)) for line in output.splitlines() if line.startswith(f"[{replica}")
                              and (m := re.search(r"resumed from \S*ckpt-(\d+)", line))))


def test_a_second_loss_right_after_a_heal_heals_from_memory_and_two_nodes_lost_with_their_peer_fall_back(
        tmp_path: Path) -> None:
    """3 nodes x 1 process (rank r's copy on rank r + 1): node 2 lost, healed from rank 0's memory; at once, before
    the next snapshot, node 1 lost too: its copy is on the replacement of node 2, which got it again right after its
    heal, so it heals from memory, to the same step. Then nodes 1 and 2 lost together (rank 1's copy was on rank 2):
    the chief says why in one line, every node restarts from the newest checkpoint, and the job ends with the weights
    of the same job resumed from that checkpoint."""
    out, hold, pause, saved = tmp_path / "job", tmp_path / "hold", tmp_path / "pause", tmp_path / "saved"
    job = Job("local", "--workers", "3", "--output-dir", str(out), "--", "run", *TRAIN, "--epochs", "1", "--",
              "--step-sleep", "0.2", "--hold", str(hold), "--pause", str(pause))
    try:
        job.wait_for("checkpoint ckpt-00000004 committed")
        job.wait_for_step(6)
        hold.touch()  # each replacement waits until the survivors said whom they wait for
        seen = len(job.lines)
        vanish(job, "workerpool1-1")
        after(job, seen, r"\[workerpool0-0\] .*waiting for workerpool1-1 \(rank 2\):")
        pause.touch()  # every rank's first step after the heal waits: no snapshot before the second loss
        hold.unlink()
        first = after(job, seen, r"\[workerpool0-0\] .*group re-formed with 3 ranks: every rank rolled back to its "
                                 r"snapshot of step (\d+), healed rank 2 from rank 0 from peer memory")
        step = int(first.group(1))
        after(job, seen, rf"\[workerpool1-1#1\] .*holds rank 1's peer snapshot of step {step} again")
        hold.touch()
        seen = len(job.lines)
        vanish(job, "workerpool1-0")
        pause.unlink()
        after(job, seen, r"\[workerpool0-0\] .*waiting for workerpool1-0 \(rank 1\):")
        hold.unlink()
        after(job, seen, rf"\[workerpool0-0\] .*group re-formed with 3 ranks: every rank rolled back to its snapshot "
                         rf"of step {step}, healed rank 1 from rank 2 from peer memory")
        job.wait_for_step(step + 6)
        hold.touch()
        seen = len(job.lines)
        vanish(job, "workerpool1-0")
        vanish(job, "workerpool1-1")
        after(job, seen, r"\[workerpool0-0\] .*waiting for workerpool1-0 \(rank 1\), workerpool1-1 \(rank 2\)")
        shutil.copytree(out / "checkpoints", saved)  # what the fallback reads (nothing commits while they wait)
        hold.unlink()
        why = after(job, seen, r"\[workerpool0-0\] \S+ WARNING (the peer-memory snapshots of rank 1 are gone: .*)$")
        assert job.wait(400) == 0, job.output()[-4000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    output = job.output()
    assert why.group(1) == f"the peer-memory snapshots of rank 1 are gone: it and its peer (rank 2) were both lost; " \
                          f"{FALLBACK}"
    kept = newest(saved)
    assert kept > step  # a commit after the heals: nothing a checkpoint held is lost
    assert resumed_from(output, "workerpool0-0") == resumed_from(output, "workerpool1-0")[-1:] == [kept]
    assert "outlived the job" not in output  # the killed nodes' processes were reaped, none left behind
    result = summary(out / "model")
    assert result["final_step"] == result["expected_steps"] and result["world_size"] == 3
    healed = [r for r in result["recoveries"] if r["how"] == "in_place"]
    assert [r["resumed_from_step"] for r in healed] == [step, step], result["recoveries"]
    # the same job resumed from that checkpoint ends with the same weights
    again = tmp_path / "again"
    (again / "checkpoints").mkdir(parents=True)
    shutil.copytree(saved / f"ckpt-{kept:08d}", again / "checkpoints" / f"ckpt-{kept:08d}")
    proc = entrypoint("local", "--workers", "3", "--output-dir", str(again), "--", "run", *TRAIN, "--epochs", "1",
                      timeout=600)
    assert proc.returncode == 0, failure_text(proc)
    resumed = summary(again / "model")
    assert resumed["final_step"] == result["final_step"]
    assert resumed["param_digests"] == result["param_digests"]
    assert (again / "model" / "model.safetensors").read_bytes() == (out / "model" / "model.safetensors").read_bytes()


# The node's GPUs as its driver lists them: two, but one on the worker node's first replacement (a VM back with a GPU
# fewer). Without --nproc-per-node a node runs one process per GPU, on CPU with gloo here (torch sees no CUDA).
NVIDIA_SMI = """#!/bin/sh
echo "GPU 0: Emulated (UUID: GPU-0)"
if [ "$TRAINER_REPLICA" != workerpool1-0 ] || [ "$TRAINER_RESTART_COUNT" != 1 ]; then
  echo "GPU 1: Emulated (UUID: GPU-1)"
fi
"""


def test_a_replacement_with_another_nproc_per_node_and_a_copy_corrupted_in_memory_each_fall_back_to_storage(
        tmp_path: Path) -> None:
    """2 nodes x 2 processes (one per GPU). The worker node is lost and comes back with one GPU, so one process: the
    chief refuses it in one line naming it and the process counts, and every node restarts from the newest
    checkpoint. Later the worker node is lost again, and while the survivors wait for it the chief's node's copies of
    its shards are corrupted in memory: the fingerprint check says so in one line naming the ranks, and every node
    restarts from the newest checkpoint again. The job ends with every step trained."""
    out, hold, spoil = tmp_path / "job", tmp_path / "hold", tmp_path / "spoil"
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(NVIDIA_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    path = f"{smi.parent}{os.pathsep}{os.environ['PATH']}"
    job = Job("local", "--workers", "2", "--output-dir", str(out), "--", "run", *TRAIN, "--epochs", "2", "--",
              "--step-sleep", "0.2", "--hold", str(hold),
              "--spoil", str(spoil), env={"PATH": path}, unset=("CUDA_VISIBLE_DEVICES",))
    try:
        job.wait_for("checkpoint ckpt-00000004 committed")
        job.wait_for_step(6)
        hold.touch()
        seen = len(job.lines)
        vanish(job, "workerpool1-0")
        after(job, seen, r"\[workerpool0-0\] .*waiting for workerpool1-0 \(rank 2\), workerpool1-0 \(rank 3\):")
        first = newest(out / "checkpoints")
        hold.unlink()
        refused = after(job, seen, r"\[workerpool0-0\] .*WARNING (the replacement of workerpool1-0 was refused: .*)$")
        back = after(job, seen, rf"\[workerpool0-0#1\] .*resumed from \S*ckpt-{first:08d}")
        after(job, seen, rf"\[workerpool0-0#1\] .*epoch \d+/\d+ step {first + 6}/")
        hold.touch()
        seen = len(job.lines)
        vanish(job, "workerpool1-0")
        after(job, seen, r"\[workerpool0-0#1\] .*waiting for workerpool1-0 \(rank 2\), workerpool1-0 \(rank 3\):")
        second = newest(out / "checkpoints")
        spoil.touch()  # ranks 0 and 1 hold ranks 2's and 3's copies: each changes one value of them in memory
        deadline = time.monotonic() + 60
        while not all(Path(f"{spoil}.{rank}").exists() for rank in (0, 1)) and time.monotonic() < deadline:
            time.sleep(0.05)
        spoiled = [Path(f"{spoil}.{rank}").read_text() for rank in (0, 1)]
        spoil.unlink()
        hold.unlink()
        corrupt = after(job, seen, r"\[workerpool0-0#1\] .*rank 0/4\] WARNING (the peer-memory snapshot of step "
                                   r"(\d+) does not match its fingerprint on .*)$")
        assert job.wait(400) == 0, job.output()[-4000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    output = job.output()
    assert refused.group(1) == "the replacement of workerpool1-0 was refused: it has --nproc-per-node 1 instead of " \
                               "2 (world size 2 instead of 4); every replica goes back to the newest checkpoint"
    assert back and first >= 4
    step = int(corrupt.group(2))
    assert all(str(step) in steps.split() for steps in spoiled), spoiled
    assert re.fullmatch(rf"the peer-memory snapshot of step {step} does not match its fingerprint on rank 2 \(\w+, "
                        rf"taken as \w+\), rank 3 \(\w+, taken as \w+\); {FALLBACK}", corrupt.group(1))
    # nothing a checkpoint held is lost: each fallback resumed every node from the newest one
    assert resumed_from(output, "workerpool0-0") == [first, second] and second > first
    assert re.search(r"\[workerpool1-0#1\] .*node 1/2: training in this process, world size 2 \(one process per "
                     r"GPU\)", output), output[-4000:]
    assert "outlived the job" not in output
    result = summary(out / "model")
    assert result["final_step"] == result["expected_steps"] and result["world_size"] == 4
