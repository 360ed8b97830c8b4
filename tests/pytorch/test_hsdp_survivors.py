"""HSDP survivors keep training (``--strategy hsdp`` across nodes, ``--recovery in-place``, the default): the worker
node's processes are SIGKILLed mid-epoch, the chief's node keeps its processes and trains on at once with fewer
replicas (the lost node's share of each global batch skipped), and the node the platform restarts joins at a step
boundary, healed rank to rank from the live replica (local rank i from local rank i), with nothing read from storage.
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
FEWER = re.compile(r"epoch \d+/\d+ step (\d+)/\d+ .*\(1 of 2 replicas\)$")


def spoil(checkpoint_dir: Path) -> list[Path]:
    """Overwrite the shards of every committed checkpoint: a rank that read one would fail to verify or load it."""
    spoiled = []
    for _, path in checkpoints.committed(checkpoint_dir):
        for shard in path.glob("*.distcp"):
            shard.write_bytes(b"\0" * shard.stat().st_size)
            spoiled.append(shard)
    return spoiled


def lose_the_worker_node(job: Job, hold: Path, noticed: str, healed: str, pause: Path | None = None) -> re.Match[str]:
    """SIGKILL the worker node, its replacement held back (``--hold``) until the survivors logged ``noticed``; the
    job ends 0 once ``healed`` was logged, the chief's node keeping its processes; the line ``healed`` matched.
    With ``pause`` (the job's ``--pause``), the survivors, once they trained a step with fewer replicas, wait inside
    their next step until both of the replacement's ranks wait to be taken in: else, on a slow machine, they could
    finish the job alone before the replacement's ranks had started."""
    survivor = replica_group(job, "workerpool0-0")
    hold.touch()  # the replacement builds its datasets once the survivors noticed the loss: else, restarted before
    vanish(job, "workerpool1-0")  # they noticed it, it would be taken in at once, as before
    job.wait_for(noticed)
    if pause is not None:
        job.wait_for(r"\[workerpool0-0\] .*\(1 of 2 replicas\)$")
        pause.touch()
    hold.unlink()
    if pause is not None:
        for rank in (2, 3):
            job.wait_for(rf"\[workerpool1-0#1\] .*joining a job in progress as rank {rank}:", timeout=240)
        pause.unlink()
    found = job.wait_for(healed, timeout=240)
    assert replica_group(job, "workerpool0-0") == survivor  # the chief's node kept its processes
    assert job.wait(300) == 0, job.output()[-4000:]
    assert wait_gone(job.marker) == []
    return found


def chief_steps(output: str) -> list[int]:
    """The steps of the chief's progress lines, in the order it logged them."""
    return [int(m.group(1)) for line in output.splitlines() if line.startswith("[workerpool0-0]")
            and (m := PROGRESS.search(line))]


def trained_samples(record: Path, resumed: int, joined: int, steps: int) -> dict[tuple[int, int], list[int]]:
    """(rank, step) -> the samples that step trained on that rank, from every process's record (one line a step).
    A survivor's step in flight at the loss was recorded, not applied, and replayed with the same batch; the lost
    processes' lines after the step the survivors resumed from were never applied; their replacements' start after
    the step they joined at."""
    found: dict[tuple[int, int], list[int]] = {}
    by_rank: dict[int, list[Path]] = {}
    for f in record.glob("*.txt"):
        by_rank.setdefault(int(f.stem.split("-rank")[1]), []).append(f)
    for rank, files in by_rank.items():
        files.sort(key=lambda f: f.stat().st_mtime)  # the lost process, then its replacement
        for n, f in enumerate(files):
            lines = [[int(i) for i in line.split()] for line in f.read_text().splitlines()]
            first = 1
            if rank < 2 and len(lines) == steps + 1:  # a survivor that had started the step in flight
                assert lines[resumed] == lines[resumed + 1], (rank, resumed)
                del lines[resumed]
            elif rank >= 2 and n == 0:
                lines = lines[:resumed]
            elif rank >= 2:
                first = joined + 1
            found.update({(rank, first + i): line for i, line in enumerate(lines)})
    return found


def test_a_lost_hsdp_node_is_healed_from_the_live_replica_and_the_survivors_never_go_back(tmp_path: Path) -> None:
    """The chief's node trains on with 1 of 2 replicas while the worker node is down, and takes its replacement in
    at a later step boundary, healed from the live replica; 0 committed steps lost, no sample seen twice."""
    out, record, hold, pause = tmp_path / "job", tmp_path / "record", tmp_path / "hold", tmp_path / "pause"
    record.mkdir()
    at = RUN.index("--epochs") + 1
    run = [*RUN[:at], "3", *RUN[at + 1:]]  # room for the replacement to join before the end
    job = Job("local", "--workers", "2", "--output-dir", str(out), "--", *run, "--", "--step-sleep", "0.2",
              "--record", str(record), "--hold", str(hold), "--pause", str(pause))
    try:
        job.wait_for("checkpoint ckpt-00000004 committed")
        job.wait_for_step(9)
        committed = max(step for step, _ in checkpoints.committed(out / "checkpoints"))
        assert spoil(out / "checkpoints"), "no checkpoint was committed before the loss"
        healed = lose_the_worker_node(
            job, hold, r"\[workerpool0-0\] .*training on with 1 of 2 replicas from step \d+ without workerpool1-0",
            HEALED, pause)
    finally:
        job.cleanup()
    output = job.output()
    # local rank i of the returning node holds, bit for bit, what local rank i of the live node holds
    fingerprints = healed.groups()[1:]
    assert fingerprints[2] == fingerprints[0] and fingerprints[3] == fingerprints[1], fingerprints
    assert fingerprints[0] != fingerprints[1]  # two shards of one replica
    assert "[workerpool0-0#1]" not in output and "[workerpool1-0#1]" in output
    # generation 1: the survivors alone; generation 2: the returning node taken in at a step boundary
    assert re.search(r"\[workerpool1-0#1\] .*joined the group \(generation 2\) at step \d+, healed rank 2 from rank "
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
    resumed, joined = lost["resumed_from_step"], int(healed.group(1))
    assert lost["lost_steps"] <= 1 and resumed >= 9
    assert resumed >= committed  # 0 committed steps lost: the job went on past its newest commit
    # the chief trained every step between the loss and the rejoin with 1 of 2 replicas, and none other
    fewer = [int(m.group(1)) for line in output.splitlines() if line.startswith("[workerpool0-0]")
             and (m := FEWER.search(line))]
    assert joined > resumed and fewer == list(range(resumed + 1, joined + 1)), (resumed, joined, fewer)
    assert lost["fewer_replicas_steps"] == joined - resumed, lost
    assert f"workerpool1-0 joined again at step {joined}; recovered after losing workerpool1-0 at step " in output
    assert f"{joined - resumed} steps trained with fewer replicas" in output
    assert (out / "model" / "model.safetensors").is_file()
    report = json.loads(entrypoint("goodput", str(out), "--json").stdout)
    assert report["disruptions"].get(IN_PLACE) == 1, report["disruptions"]
    assert report["steps"]["lost"] <= 1 and report["steps"]["fewer_replicas"] == joined - resumed, report["steps"]
    # the lost node's share of the steps it was out is skipped, no sample is seen twice in an epoch
    total, per_epoch = result["expected_steps"], result["expected_steps"] // 3
    found = trained_samples(record, resumed, joined, total)
    out_steps = {(r, s) for r in (2, 3) for s in range(resumed + 1, joined + 1)}
    assert set(found) == {(r, s) for r in range(4) for s in range(1, total + 1)} - out_steps
    for epoch in range(3):
        seen = [i for (_, s), line in found.items() if (s - 1) // per_epoch == epoch for i in line]
        assert len(seen) == len(set(seen)), epoch


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
