"""doctor's decisions on made-up facts: no nvidia-smi here, so drivers, GPUs, /dev/shm sizes and limits are faked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from entrypoint import cli, doctor
from entrypoint.cluster import memory
from entrypoint.cluster.environments.settings import PlatformSettings
from entrypoint.doctor import checks, facts
from entrypoint.doctor.checks import GIB, MIB
from entrypoint.doctor.facts import UNLIMITED, NodeFacts, PathFacts, Space
from entrypoint.planning import registry

DOCKER_SHM = Space(total=64 * MIB, free=64 * MIB)


# ---- /dev/shm ----------------------------------------------------------------------------------------
def test_docker_default_shm_caps_the_hooks_loop_workers_and_names_the_fix() -> None:
    finding, cap = checks.shm(DOCKER_SHM, nproc=1, workers=4, cappable=True, nccl=False)
    assert (finding.status, cap) == ("warning", 1)
    assert "Docker's default" in finding.message and "caps --data-workers at 1 (was 4)" in finding.message
    assert "--shm-size" in (finding.fix or "") and "--ipc=host" in (finding.fix or "")


def test_shm_cap_counts_every_process_on_the_node_and_nccl() -> None:
    big = Space(total=2 * GIB, free=2 * GIB)
    assert checks.shm(big, nproc=8, workers=2, cappable=True, nccl=False)[1] is None  # 8 x 2 x 64 MiB fit
    finding, cap = checks.shm(big, nproc=8, workers=4, cappable=True, nccl=True)  # 1 GiB for NCCL, 1 GiB for 32
    assert finding.status == "warning" and cap == 2 and "NCCL" in finding.message
    finding, cap = checks.shm(DOCKER_SHM, nproc=8, workers=2, cappable=True, nccl=True)
    assert cap == 0  # workers off: the loader then reads in the training process, slower but alive


def test_enough_shm_is_ok_and_nothing_is_capped() -> None:
    finding, cap = checks.shm(Space(total=16 * GIB, free=15 * GIB), nproc=8, workers=2, cappable=True, nccl=True)
    assert (finding.status, cap) == ("ok", None)
    finding, cap = checks.shm(DOCKER_SHM, nproc=1, workers=0, cappable=True, nccl=False)
    assert (finding.status, cap) == ("ok", None)


def test_a_script_dataloader_is_warned_about_but_not_capped() -> None:
    finding, cap = checks.shm(DOCKER_SHM, nproc=2, workers=2, cappable=False, nccl=False)
    assert (finding.status, cap) == ("warning", None) and "Bus error" in finding.message


def test_no_dev_shm_at_all_turns_workers_off() -> None:
    finding, cap = checks.shm(None, nproc=1, workers=2, cappable=True, nccl=False)
    assert (finding.status, cap) == ("warning", 0)


# ---- driver and GPUs ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("driver", "cuda", "status"), [
    ("580.65.06", "13.0", "ok"), ("590.12", "13.0", "ok"), ("575.57.08", "13.0", "error"),
    ("535.104.05", "13.0", "error"), ("525.60.13", "12.9", "ok"), ("535.104.05", "12.9", "ok"),
    ("520.61.05", "12.9", "error"), ("470.82", "11.8", "ok"),
])
def test_driver_against_the_image_cuda(driver: str, cuda: str, status: str) -> None:
    finding = checks.driver(driver, cuda, forward_compat=False, driver_gpus=1)
    assert finding.status == status, finding.line()
    if status == "error":
        assert "driver version is insufficient" in finding.message and finding.fix
        assert finding.to_dict()["exit_code"] == 2


def test_an_old_driver_with_forward_compatibility_libraries_is_only_a_warning() -> None:
    finding = checks.driver("535.104.05", "13.0", forward_compat=True, driver_gpus=8)
    assert finding.status == "warning" and "data-center GPUs" in finding.message


def test_driver_without_gpus_or_cuda() -> None:
    assert checks.driver(None, None, False, 0).status == "skipped"
    assert checks.driver("580.65.06", None, False, 4).status == "warning"  # the CPU image on a GPU machine
    assert checks.driver(None, "13.0", False, 0).status == "skipped"  # the GPU image on a CPU machine


@pytest.mark.parametrize(("framework", "nproc", "planned", "driver_gpus", "forced", "status"), [
    ("pytorch", 8, 8, 8, False, "ok"),
    ("pytorch", 8, 8, 4, True, "error"),  # --nproc-per-node 8 on a 4-GPU node
    ("horovod", 4, 4, 2, False, "error"),  # CUDA_VISIBLE_DEVICES names GPUs that are not there
    ("pytorch", 2, 8, 8, True, "warning"),  # 6 GPUs idle
    ("pytorch", 2, 2, 8, False, "ok"),  # CUDA_VISIBLE_DEVICES=0,1 on an 8-GPU node
    ("tensorflow", 1, 8, 8, False, "ok"),
    ("pytorch", 1, 2, 0, False, "warning"),  # CUDA_VISIBLE_DEVICES set, no driver
    ("pytorch", 1, 0, 0, False, "skipped"),
    ("pytorch", 1, 0, 8, False, "ok"),  # CUDA_VISIBLE_DEVICES="" hides every GPU
])
def test_gpus_against_the_plan(framework: str, nproc: int, planned: int, driver_gpus: int, forced: bool,
                               status: str) -> None:
    finding = checks.gpus(framework, nproc, planned, driver_gpus, "13.0", forced)
    assert finding.status == status, finding.line()


@pytest.mark.parametrize(("given", "usable", "status"), [(None, 2, "ok"), (2, 2, "ok"), (1, 4, "ok"),
                                                        (3, 2, "warning"), (64, 2, "warning")])
def test_trainer_cpus_above_the_affinity_is_a_warning(given: int | None, usable: int, status: str) -> None:
    found = checks.cpus(given, usable)
    assert found.status == status
    if status == "warning":
        assert found.message.startswith(f"TRAINER_CPUS={given} but this process may run on {usable} CPUs")
        assert found.fix == f"TRAINER_CPUS={usable} or fewer (or leave it unset)"


def test_preflight_warns_once_about_trainer_cpus_and_runs_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    fake_node(monkeypatch, shm=Space(total=GIB, free=GIB))
    plan = cli.build_plan(cli.parse_options("run", ["--framework", "pytorch", "--job-dir", str(tmp_path)]))
    with caplog.at_level("WARNING", logger="entrypoint"):
        assert doctor.preflight(plan, PlatformSettings(cpus=64)) == plan
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("doctor: cpus: TRAINER_CPUS=64 but this process may run on 2 CPUs") and "\n" not in line


def test_the_cpus_fact_is_this_process_affinity() -> None:
    assert facts.node_facts(PlatformSettings()).cpus == len(os.sched_getaffinity(0))


def test_driver_version_is_read_from_the_kernel_module_line() -> None:
    text = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    assert facts.driver_version(text) == "580.65.06"
    old = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:13:16 UTC 2023"
    assert facts.driver_version(old) == "535.104.05"


# ---- interfaces and limits ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("spec", "expected"), [
    ("eth", ["eth0", "eth1"]), ("=eth0", ["eth0"]), ("^lo,docker", ["eth0", "eth1", "ib0"]), ("=eth", []),
    ("ib,eth1", ["eth1", "ib0"]), ("^=eth0", ["lo", "docker0", "eth1", "ib0"]),
])
def test_nccl_socket_ifname_follows_ncclss_rules(spec: str, expected: list[str]) -> None:
    assert checks.nccl_matches(spec, ("lo", "docker0", "eth0", "eth1", "ib0")) == expected


def test_an_interface_that_is_not_there_is_an_error_only_where_it_is_used() -> None:
    here = ("lo", "eth0")
    assert checks.interfaces("ens5", None, here, nccl=True, gloo=False).status == "error"
    assert checks.interfaces("eth", None, here, nccl=True, gloo=False).status == "ok"
    assert checks.interfaces(None, "eth1", here, nccl=False, gloo=True).status == "error"
    assert checks.interfaces("ens5", "eth1", here, nccl=False, gloo=False).status == "skipped"
    assert checks.interfaces(None, None, here, nccl=True, gloo=False).status == "ok"


def test_limits() -> None:
    assert checks.nofile((1024, 4096), workers=2).status == "warning"
    assert checks.nofile((1024, 4096), workers=0).status == "ok"
    assert checks.nofile((UNLIMITED, UNLIMITED), workers=8).status == "ok"
    assert checks.memlock((64 * 1024, 64 * 1024), nccl=True).status == "warning"
    assert checks.memlock((UNLIMITED, UNLIMITED), nccl=True).status == "ok"
    assert checks.memlock((64 * 1024, 64 * 1024), nccl=False).status == "skipped"


# ---- outputs, disk, peers ------------------------------------------------------------------------------------
def test_outputs_not_writable_is_an_error_on_the_chief_and_a_warning_elsewhere() -> None:
    places = [("job dir", PathFacts("/out", "/out", True, GIB)),
              ("model dir", PathFacts("/ro/model", "/ro", False, GIB))]
    chief = checks.outputs(places, chief=True)
    assert chief.status == "error" and chief.failure.exit_code == 73 and "/ro/model" in chief.message
    assert checks.outputs(places[1:], chief=False).status == "warning"
    assert checks.outputs(places[:1], chief=True).status == "ok"
    cloud = [("model dir", PathFacts("gs://b/model", None, False, None))]
    assert checks.outputs(cloud, chief=True).status == "skipped"


@pytest.mark.parametrize(("free", "checkpoint", "status"), [
    (10 * GIB, 2 * GIB, "ok"), (3 * GIB, 2 * GIB, "warning"), (GIB, 2 * GIB, "error"),
    (10 * GIB, None, "ok"), (100 * MIB, None, "warning"), (None, None, "skipped"),
])
def test_disk_has_room_for_two_checkpoints(free: int | None, checkpoint: int | None, status: str) -> None:
    finding = checks.disk(free, checkpoint, "/ckpt")
    assert finding.status == status, finding.line()
    if status == "error":
        assert finding.failure.exit_code == 74


def test_unresolvable_peers_are_a_warning_the_barrier_waits_for() -> None:
    assert checks.peers({}).status == "skipped"
    assert checks.peers({"chief-0": True, "worker-0": True}).status == "ok"
    finding = checks.peers({"chief-0": False, "worker-0": True})
    assert finding.status == "warning" and "chief-0" in finding.message and "196" in finding.message


def test_host_of_addresses() -> None:
    assert facts.host_of("cmle-training-workerpool0-ab-0:2222") == "cmle-training-workerpool0-ab-0"
    assert facts.host_of("[::1]:2222") == "::1"
    assert facts.host_of("10.0.0.2:29500") == "10.0.0.2"


def test_checkpoint_size_comes_from_the_newest_marker(tmp_path: Path) -> None:
    assert facts.checkpoint_bytes(str(tmp_path)) is None
    for step, size in ((10, 100), (20, 300)):
        ckpt = tmp_path / f"ckpt-{step:08d}"
        ckpt.mkdir()
        (ckpt / "state.pt").write_bytes(b"x" * size)
        (ckpt / "COMMITTED").write_text(json.dumps({"files": {"state.pt": {"size": size, "sha256": "x"}}}))
    assert facts.checkpoint_bytes(str(tmp_path)) == 300


def test_a_marker_whose_sizes_the_files_do_not_have_is_not_trusted(tmp_path: Path) -> None:
    """A corrupt size in the newest marker (10^18 bytes) would fail the preflight as a full disk (74, permanent);
    resume skips that checkpoint, so the size that counts is the newest one whose files match their marker."""
    for step, size, says in ((10, 100, 100), (20, 300, 10**18)):
        ckpt = tmp_path / f"ckpt-{step:08d}"
        ckpt.mkdir()
        (ckpt / "state.pt").write_bytes(b"x" * size)
        (ckpt / "COMMITTED").write_text(json.dumps({"files": {"state.pt": {"size": says, "sha256": "x"}}}))
    assert facts.checkpoint_bytes(str(tmp_path)) == 100


# ---- the plan, the preflight and the command ------------------------------------------------------------------
def node(**changes: object) -> NodeFacts:
    base = dict(shm=DOCKER_SHM, driver=None, driver_gpus=0, image_cuda=None, forward_compat=False,
                interfaces=("lo", "eth0"), nofile=(65536, 65536), memlock=(UNLIMITED, UNLIMITED), cpus=2)
    return NodeFacts(**{**base, **changes})  # type: ignore[arg-type]


def fake_node(monkeypatch: pytest.MonkeyPatch, **changes: object) -> None:
    monkeypatch.setattr(doctor, "node_facts", lambda _settings: node(**changes))


def test_preflight_caps_data_workers_in_the_plan_it_hands_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    fake_node(monkeypatch)
    plan = cli.build_plan(cli.parse_options("run", ["--framework", "pytorch", "--module", "trainers.digits_torch",
                                                   "--job-dir", str(tmp_path), "--data-workers", "4"]))
    with caplog.at_level("WARNING", logger="entrypoint"):
        placed = doctor.preflight(plan, PlatformSettings())
    assert placed.options.data_workers == 1 and plan.options.data_workers == 4
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "shm:" in caplog.records[0].getMessage()


def test_preflight_ends_the_run_on_an_error_with_its_class(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_node(monkeypatch, driver="535.104.05", driver_gpus=2, image_cuda="13.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    plan = cli.build_plan(cli.parse_options("run", ["--framework", "pytorch", "--job-dir", str(tmp_path)]))
    with pytest.raises(doctor.PreflightError) as raised:
        doctor.preflight(plan, PlatformSettings())
    assert raised.value.exit_code == 2 and "driver 535.104.05 is older than CUDA 13.0" in str(raised.value)
    readonly = PathFacts(str(tmp_path), str(tmp_path), False, GIB)
    fake_node(monkeypatch)
    monkeypatch.setattr(doctor, "path_facts", lambda _where: readonly)
    with pytest.raises(doctor.PreflightError) as raised:
        doctor.preflight(plan, PlatformSettings())
    assert raised.value.exit_code == 73


def test_doctor_command_lines_json_and_exit_code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    fake_node(monkeypatch, driver="575.57.08", driver_gpus=4, image_cuda="13.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert cli.main(["doctor", "--framework", "pytorch", "--job-dir", str(tmp_path)]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == [
        "framework:", "shm:", "driver:", "gpus:", "cpus:", "network:", "nofile:", "memlock:", "image:", "peer",
        "outputs:", "disk:", "peers:", "fabric:"]
    assert lines[0].startswith("ok      framework: pytorch (torch ")
    assert lines[2].startswith("error   driver: driver 575.57.08 is older than CUDA 13.0 needs (580 or newer)")
    assert lines[1].startswith("warning shm: /dev/shm has 64 MiB free of 64 MiB (Docker's default)")
    assert cli.main(["doctor", "--framework", "pytorch", "--job-dir", str(tmp_path), "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["exit_code"] == 2
    by_check = {c["check"]: c for c in report["checks"]}
    assert by_check["driver"]["class"] == "config" and by_check["shm"]["fix"].startswith("docker run --shm-size")


@pytest.mark.parametrize(("code", "status"), [(("--module", "trainers.digits_torch"), "error"),
                                              (("--script", __file__), "warning")])
def test_doctor_says_what_run_says_of_a_framework_this_python_lacks(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                                    code: tuple[str, str], status: str) -> None:
    """A hooks or module job: run's configuration error (exit 2); a script: run's warning (it runs as it is)."""
    missing = next(name for name in registry.REGISTRY if not registry.get(name).installed())
    found = cli.main(["doctor", "--framework", missing, *code, "--job-dir", str(tmp_path), "--json"])
    (check,) = [c for c in json.loads(capsys.readouterr().out)["checks"] if c["check"] == "framework"]
    assert (check["status"], found) == (status, 2 if status == "error" else 0), check
    assert check["message"].startswith(f"{missing} is not installed in this Python (installed here: ")
    assert check["fix"] == registry.where_installed(registry.get(missing))


def test_doctor_bad_options_are_one_config_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["doctor", "--log-format", "xml"]) == 2
    assert capsys.readouterr().err.startswith("entrypoint: error: doctor: argument --log-format")


# ---- FSDP's snapshots in peer memory --------------------------------------------------------------------------
def test_peer_snapshots_per_parameter_against_the_nodes_memory() -> None:
    """70B parameters over 2 nodes of 8 GPUs: 5 copies x 12 bytes / 16 ranks x 8 here = 30 bytes a parameter; a node
    giving 1.8 TiB holds the copies of a 32.2B-parameter model in half of it (ok); one giving 40 GiB, of 0.7B (a
    warning under --strategy fsdp, ok where FSDP comes only by the model's size)."""
    big = memory.HostMemory(1800 * GIB, "MemAvailable")
    found = checks.peer_snapshots("fsdp", big, 16, 8)
    assert found.status == "ok", found
    assert found.message == (
        "1800.0 GiB available (MemAvailable); FSDP's snapshots in peer memory take 5 copies x 12 bytes per parameter "
        "(fp32 weights and Adam state) / 16 ranks x 8 ranks here = 30 bytes per model parameter: a model of up to 32.2 "
        "B parameters fits in 50% of it (larger: the run turns them off)")
    small = memory.HostMemory(40 * GIB, "the cgroup v2 limit")
    warned = checks.peer_snapshots("fsdp", small, 16, 8)
    assert warned.status == "warning" and "up to 0.7 B parameters" in warned.message, warned
    assert warned.fix is not None and warned.fix.startswith("--peer-snapshots off")
    by_size = checks.peer_snapshots("fsdp by size", small, 16, 8)
    assert by_size.status == "ok" and "(where FSDP is chosen by the model's size)" in by_size.message
    unknown = checks.peer_snapshots("fsdp", memory.UNKNOWN, 16, 8)
    assert unknown.status == "warning" and unknown.message.startswith("host memory unknown")
    assert checks.peer_snapshots(None, big, 16, 8).status == "skipped"


TWO_NODES = json.dumps({"cluster": {"workerpool0": ["h0:2222"], "workerpool1": ["h1:2222"]},
                        "task": {"type": "workerpool0", "index": 0}})


@pytest.mark.parametrize(("flags", "status"), [(("--strategy", "fsdp"), "warning"), ((), "ok"),
                                               (("--strategy", "fsdp", "--peer-snapshots", "off"), "skipped"),
                                               (("--strategy", "fsdp", "--recovery", "restart"), "skipped"),
                                               (("--strategy", "hsdp"), "skipped")])
def test_doctor_sizes_the_peer_snapshots_of_an_fsdp_plan_across_nodes(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: tuple[str, ...],
        status: str) -> None:
    fake_node(monkeypatch, host_memory=memory.HostMemory(8 * GIB, "the cgroup v2 limit"))
    monkeypatch.setenv("CLUSTER_SPEC", TWO_NODES)
    cli.main(["doctor", "--framework", "pytorch", "--module", "trainers.digits_torch", "--job-dir", str(tmp_path),
              "--nproc-per-node", "2", *flags, "--json"])
    (check,) = [c for c in json.loads(capsys.readouterr().out)["checks"] if c["check"] == "peer snapshots"]
    assert check["status"] == status, check
    if status != "skipped":
        assert check["message"].startswith("8.0 GiB available (the cgroup v2 limit); FSDP's snapshots in peer memory")
        assert "/ 4 ranks x 2 ranks here = 30 bytes per model parameter: a model of up to 0.1 B" in check["message"]


def test_doctor_skips_the_peer_snapshots_on_one_node(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cli.main(["doctor", "--framework", "pytorch", "--strategy", "fsdp", "--job-dir", str(tmp_path), "--json"])
    (check,) = [c for c in json.loads(capsys.readouterr().out)["checks"] if c["check"] == "peer snapshots"]
    assert check["status"] == "skipped"
